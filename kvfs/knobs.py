"""Runtime knobs: the settings `kvfs` can change on a mounted filesystem (the control file's
`set` action). One object, read by the components that use a knob and reported by statistics,
so what is reported is what runs."""

from __future__ import annotations

from dataclasses import dataclass

from kvfs.config import Config


@dataclass
class Knobs:
    prefetch_enabled: bool = True
    prefetch_max_window: int = 16
    pool_evict: str = "prefix"  # "prefix", "lru" or "never"

    @classmethod
    def from_config(cls, cfg: Config) -> "Knobs":
        return cls(
            prefetch_enabled=cfg.prefetch.enabled,
            prefetch_max_window=cfg.prefetch.max_window,
            pool_evict=cfg.pool.evict,
        )
