"""PopulationGraph: declare populations, wire delayed connections, use the graph as a policy."""

import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks import (
    CategoricalSampler,
    Filter,
    Flattener,
    PPOAdapter,
    Scale,
    Sequential,
)
from nnx_ppo.networks.graph import PopulationGraph

# A delay line: "late" receives what "early" output two steps before.
line = PopulationGraph(nnx.Rngs(0))
line.add_input("early", 1, input_from="x")
line.add_output("late", 1)
line.connect("early", "late", transform=Scale(1.0), delay=2)  # Scale(1.0): an identity
line.finalize()
state = line.initialize_state(1)  # early keeps its last 2 outputs: buffer (1, 2, 1)
received = []
for t in range(4):
    out = line(state, {"x": jnp.full((1, 1), float(t + 1))})
    state = out.next_state
    received.append(float(out.output["late"][0, 0]))
print("inputs 1, 2, 3, 4 -> late", received)
print("after a reset, buffer:", line.reset_state(state)["populations"]["early"]["buffer"].ravel())

# Zero-delay connections must not form a cycle: finalize() names it.
loop = PopulationGraph(nnx.Rngs(0))
loop.add_population("a", 2)
loop.add_output("b", 2)
loop.connect("a", "b", reciprocal=True)
try:
    loop.finalize()
except ValueError as error:
    print(error)

# An actor-critic for the memory task (4 observation features, 2 actions): the
# graph's only memory is the delayed self-loop on "memory".
rngs = nnx.Rngs(0)
graph = PopulationGraph(rngs)
graph.add_input("sensory", 4, input_from="obs")
graph.add_population("memory", 32, activation=jnp.tanh)
graph.add_output("policy", 2)
graph.add_output("value", 1)
graph.connect("sensory", "memory")
graph.connect("memory", "memory", delay=1)
graph.connect("memory", "policy")
graph.connect("memory", "value")
graph.finalize()
print("evaluation order:", graph.evaluation_order)

network = Sequential(
    [
        Filter({"obs": lambda obs: obs}),  # the env's array observation as {"obs": ...}
        graph,
        PPOAdapter(
            action=Sequential(
                [
                    Filter({"policy": "policy"}),
                    Flattener(),
                    CategoricalSampler(rngs, entropy_weight=0.01),
                ]
            ),
            value=Sequential([Filter({"value": "value"}), Flattener()]),
        ),
    ]
)
out = network(network.initialize_state(5), jnp.zeros((5, 4)))
print("actions", out.output.actions.shape, "values", out.output.value_estimates.shape)
