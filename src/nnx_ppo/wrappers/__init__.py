"""Environment wrappers: each wraps one unbatched env and forwards its attributes."""

from nnx_ppo.wrappers.base import Wrapper
from nnx_ppo.wrappers.episode_wrapper import EpisodeWrapper
from nnx_ppo.wrappers.reward_scaling_wrapper import RewardScalingWrapper

__all__ = ["EpisodeWrapper", "RewardScalingWrapper", "Wrapper"]
