# Stubs for the part of tensorboardX that nnx-ppo uses (tensorboardX ships no types).
from types import TracebackType

class SummaryWriter:
    def __init__(
        self,
        logdir: str | None = ...,
        comment: str = ...,
        purge_step: int | None = ...,
        max_queue: int = ...,
        flush_secs: int = ...,
        filename_suffix: str = ...,
    ) -> None: ...
    def add_scalar(
        self,
        tag: str,
        scalar_value: float,
        global_step: int | None = ...,
        walltime: float | None = ...,
    ) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> SummaryWriter: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...
