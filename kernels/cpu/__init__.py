"""The CPU kernels in C (`csrc/`) and their ctypes bindings: `native` builds and loads the library (None without
a C compiler: every binding then reports itself unavailable and the engine keeps its PyTorch paths), `ops`
(fused decoder-layer ops), `linear` (pre-packed GEMMs), `paged_attention`, and `threads` (torch's thread count
from the container's CPU quota). Importing this package compiles nothing."""
