"""The stand-in's prefix cache in two tiers, as SGLang's radix cache with HiCache keeps it.

SGLang 0.5.23 (``srt/mem_cache/hiradix_cache.py``): the device tier is the GPU KV pool
(``max_total_num_tokens`` in ``/server_info``); with ``--enable-hierarchical-cache`` the host tier
holds ``hicache-ratio`` times as many tokens (resolved default 2.0), written through from the
device tier. A prefix evicted from the device tier stays in the host tier and is **loaded back**
when a request matches it again; ``/flush_cache`` resets both. Without HiCache an evicted prefix
is gone. Entries are message prefixes (a radix tree over whole messages), each sized at about four
characters per token; least recently used goes first in each tier.
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixCache:
    """Device and host tiers of message prefixes: ``device`` and ``host`` map a prefix key to its
    own tokens (the last message's), in least-recently-used order."""

    def __init__(self, device_tokens: int, host_ratio: float | None):
        self.device_cap = max(1, int(device_tokens))
        self.host_cap = int(self.device_cap * host_ratio) if host_ratio else 0
        self.device: OrderedDict = OrderedDict()
        self.host: OrderedDict = OrderedDict()
        self.device_used = self.host_used = 0

    def clear(self) -> None:
        """``/flush_cache``: both tiers."""
        self.device.clear()
        self.host.clear()
        self.device_used = self.host_used = 0

    def __len__(self) -> int:
        return len(self.device) + len(self.host)

    def lookup(self, keys: list, sizes: list[int]) -> tuple[int, int]:
        """Match the prefixes ``keys`` (one per message, each ``sizes[i]`` tokens) and insert what
        is new: (cached tokens, of them loaded back from the host tier). The cached part is the
        longest run of known prefixes from the start."""
        cached = host = 0
        matching = True
        for k, n in zip(keys, sizes):
            if matching and k in self.device:
                self.device.move_to_end(k)
                cached += n
            elif matching and k in self.host:
                self._to_device(k, n)                 # loaded back
                cached += n
                host += n
            else:
                matching = False
                if k not in self.device:
                    self._to_device(k, n)
        return cached, host

    def _to_device(self, k, n: int) -> None:
        self.device[k] = n
        self.device_used += n
        if self.host_cap and k not in self.host:       # write-through to the host tier
            self.host[k] = n
            self.host_used += n
        elif k in self.host:
            self.host.move_to_end(k)
        while self.device_used > self.device_cap and len(self.device) > 1:
            _, m = self.device.popitem(last=False)
            self.device_used -= m
        while self.host_used > self.host_cap and self.host:
            _, m = self.host.popitem(last=False)
            self.host_used -= m
