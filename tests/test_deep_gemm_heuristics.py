"""DeepGEMM's choice of kernel, reproduced (``buildops.backends.deep_gemm.heuristics``), against what the real
library chose.

``CHOICES`` are the tilings DeepGEMM 2.6.1's own heuristics (``SM90ArchSpec`` and ``get_best_config`` of commit
54e2261, compiled unchanged with stub headers for the CUDA and torch types they name) returned for these calls; the
reproduction was also checked there on 60,000 random calls and on every M up to 8192 of five dense shapes, with no
difference (docs/backends/deep_gemm.md). The GPU host's run adds the count of kernels the real library compiled.
"""

import pytest

from buildops.backends.deep_gemm import GemmShape, shape_ms
from buildops.backends.deep_gemm.heuristics import Tiling, tiling, tilings, why_not_predicted
from buildops.backends.deep_gemm.shapes import rows_for

# (kind, M, N, K, groups, multiprocessors, contiguous alignment, block widths' multiple) -> (block M, block N,
# cluster M, cluster N); M: tokens (dense), padded rows (contiguous), expected rows per expert (masked)
CHOICES = [
    (("dense", 1, 5120, 2048, 1, 132, 128, 1), (16, 48, 1, 1)),
    (("dense", 16, 5120, 2048, 1, 132, 128, 1), (16, 48, 1, 1)),
    (("dense", 32, 5120, 2048, 1, 132, 128, 1), (32, 48, 1, 1)),
    (("dense", 100, 5120, 2048, 1, 132, 128, 1), (64, 80, 1, 1)),
    (("dense", 512, 5120, 2048, 1, 132, 128, 1), (128, 160, 1, 1)),
    (("dense", 1024, 5120, 2048, 1, 132, 128, 1), (128, 160, 2, 1)),
    (("dense", 4096, 5120, 2048, 1, 132, 128, 1), (256, 128, 1, 2)),
    (("dense", 8192, 7168, 16384, 1, 132, 128, 1), (256, 128, 1, 2)),
    (("dense", 300, 576, 7168, 1, 132, 128, 1), (64, 32, 1, 1)),
    (("dense", 2000, 32768, 512, 1, 132, 128, 1), (256, 128, 1, 2)),
    (("dense", 77, 2048, 4096, 1, 78, 128, 1), (64, 64, 1, 1)),
    (("dense", 640, 24576, 1536, 1, 114, 128, 1), (128, 192, 1, 2)),
    (("dense", 9, 4096, 7168, 1, 132, 128, 3), (16, 48, 1, 1)),
    (("dense", 3000, 4096, 7168, 1, 132, 128, 48), (128, 192, 2, 1)),
    (("dense", 5, 333, 1000, 1, 16, 128, 1), (16, 32, 1, 1)),
    (("contiguous", 128, 1536, 2048, 128, 132, 128, 1), (128, 16, 1, 1)),
    (("contiguous", 8192, 1536, 2048, 128, 132, 128, 1), (128, 192, 2, 1)),
    (("contiguous", 24576, 2048, 768, 128, 132, 128, 1), (128, 192, 2, 1)),
    (("contiguous", 2048, 4096, 7168, 256, 132, 128, 1), (128, 192, 2, 1)),
    (("contiguous", 64, 7168, 2048, 256, 132, 64, 1), (64, 64, 1, 1)),
    (("contiguous", 3840, 7168, 2048, 256, 132, 256, 1), (256, 128, 1, 2)),
    (("masked", 1, 4096, 7168, 32, 132, 128, 1), (64, 128, 2, 1)),
    (("masked", 64, 4096, 7168, 32, 132, 128, 1), (64, 128, 2, 1)),
    (("masked", 200, 7168, 2048, 8, 132, 128, 1), (128, 192, 2, 1)),
    (("masked", 1000, 7168, 2048, 256, 132, 128, 1), (128, 192, 2, 1)),
    (("masked", 17, 3072, 1024, 2, 66, 128, 1), (64, 96, 1, 1)),
    (("contiguous", 6528, 21440, 896, 8, 114, 128, 1), (128, 192, 1, 2)),
    (("dense", 9549, 1984, 14976, 1, 114, 64, 1), (256, 112, 1, 2)),
    (("dense", 1409, 14336, 6912, 1, 132, 128, 1), (256, 112, 1, 2)),
    (("dense", 9029, 14016, 1024, 1, 114, 128, 1), (256, 128, 1, 2)),
    (("dense", 10333, 20672, 9600, 1, 132, 128, 1), (256, 128, 1, 2)),
    (("masked", 813, 7360, 768, 256, 132, 64, 1), (128, 160, 2, 1)),
    (("contiguous", 1216, 17792, 2048, 256, 78, 64, 1), (64, 192, 1, 1)),
    (("masked", 1689, 19136, 9472, 256, 132, 128, 1), (128, 192, 2, 1)),
    (("contiguous", 9088, 23424, 1152, 256, 132, 128, 1), (128, 192, 2, 1)),
    (("masked", 8134, 22400, 8832, 64, 78, 128, 1), (128, 192, 1, 1)),
    (("contiguous", 3008, 9920, 4096, 8, 114, 64, 1), (64, 192, 2, 1)),
    (("dense", 9412, 9920, 8704, 1, 78, 128, 1), (256, 128, 1, 1)),
    (("contiguous", 2368, 20032, 16128, 8, 132, 64, 1), (64, 192, 2, 1)),
    (("masked", 2703, 24896, 5632, 8, 78, 64, 1), (128, 192, 1, 1)),
]


@pytest.mark.parametrize("call, chosen", CHOICES)
def test_the_tiling_is_the_one_deep_gemm_picks(call, chosen):
    kind, m, n, k, groups, sms, alignment, multiple_of = call
    assert tiling(kind, m, n, k, groups, sms, alignment, multiple_of) == Tiling(*chosen)


def test_the_kernels_of_a_qwen3_layer_are_the_60_the_real_deep_gemm_compiled():
    """The GPU host's record (docs/benchmarks.md, DeepGEMM's warmup): a Qwen3-30B-A3B layer's relaxed sweep to 1024
    tokens, top-8, made 60 kernels on an H200: a GEMM kernel per tiling of each shape, and a copy of the
    activations' scales per width (K / 128: 16, 32 and 6)."""
    shapes = [GemmShape("dense", 5120, 2048), GemmShape("dense", 2048, 4096),
              GemmShape("contiguous", 1536, 2048, 128), GemmShape("contiguous", 2048, 768, 128)]
    gemms = 0
    for shape in shapes:
        calls = {rows_for(shape, m) for m in shape_ms(shape, 1024, "relaxed", 132, top_k=8)}
        gemms += len(tilings(shape.kind, calls, shape.n, shape.k, shape.experts))
    assert gemms + len({shape.k // 128 for shape in shapes}) == 60


def test_tilings_group_the_ms_in_order_and_agree_with_one_at_a_time():
    by_tiling = tilings("dense", range(1, 600), 5120, 2048)
    assert sorted(m for ms in by_tiling.values() for m in ms) == list(range(1, 600))
    assert all(ms == sorted(ms) for ms in by_tiling.values())
    for chosen, ms in by_tiling.items():
        assert {tiling("dense", m, 5120, 2048) for m in (ms[0], ms[-1])} == {chosen}


def test_only_the_versions_and_architectures_checked_are_predicted():
    assert why_not_predicted("2.6.1", "sm_90") is None and why_not_predicted("2.6.1+54e2261", "sm_90") is None
    assert "2.6.2" in why_not_predicted("2.6.2", "sm_90")  # a patch release may change them
    assert "sm_100" in why_not_predicted("2.6.1", "sm_100")
    assert "2.7.0" in why_not_predicted("2.7.0", "sm_90") and "unknown" in why_not_predicted("unknown", "sm_90")


def test_what_deep_gemm_would_refuse_is_refused():
    with pytest.raises(ValueError, match="even number of multiprocessors, not 7"):
        tiling("dense", 64, 128, 128, sms=7)
    with pytest.raises(ValueError, match="no tiling for dense N=128 K=8388608"):
        tiling("dense", 64, 128, 8 << 20)  # its scales alone fill the shared memory: too few stages for any block
