from nnx_ppo.networks.summary import print_summary, summary

__all__ = ["print_summary", "summary"]
