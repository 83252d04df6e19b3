"""Recording a deterministic episode during training: VideoConfig, env.render and video_fn."""

import os
import tempfile

import numpy as np
from flax import nnx

from nnx_ppo import envs
from nnx_ppo.algorithms.callbacks import gif_video_fn
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig, VideoConfig
from nnx_ppo.algorithms.ppo import train_ppo
from nnx_ppo.networks.factories import make_default_network
from nnx_ppo.wrappers import Wrapper


class DrawnPendulum(Wrapper):
    """Pendulum with a toy renderer: one bright pixel where the tip of the pole is."""

    def render(self, trajectory, height, width):
        frames = []
        for state in trajectory:  # one unbatched state per step
            cos, sin = float(state.obs[0]), float(state.obs[1])
            frame = np.zeros((height, width, 3), np.uint8)
            row = int((1 - cos) / 2 * (height - 1))
            column = int((1 + sin) / 2 * (width - 1))
            frame[row, column] = 255
            frames.append(frame)
        return frames


env = DrawnPendulum(envs.make("pendulum"))
network = make_default_network(env, nnx.Rngs(0), hidden_sizes=(8,))
config = TrainConfig(
    ppo=PPOConfig(n_envs=4, rollout_length=16, total_steps=128, n_minibatches=2),
    eval=EvalConfig(enabled=False),
    video=VideoConfig(
        enabled=True, every_steps=64, episode_length=20, render_kwargs={"height": 8, "width": 8}
    ),
)


videos = tempfile.mkdtemp()
write_gif = gif_video_fn(videos, fps=1 / env.dt)  # plays in real time


def video_fn(video):
    frames, reward = video.frames, video.episode_reward
    print(f"step {video.step}: {frames.shape} {frames.dtype} frames, return {reward:.1f}")
    write_gif(video)


train_ppo(env, network, config, video_fn=video_fn)
print("written:", sorted(os.listdir(videos)))
