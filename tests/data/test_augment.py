"""RandomAffine: the batched warp matches the per-sample PIL warp, and both draw alike.

Geometry is compared pixel by pixel on synthetic digits; the draws are compared statistically
(means, variances, two-sample Kolmogorov-Smirnov), not bit for bit, since the two paths use the
RNG differently (4 scalar draws per sample vs one ``torch.rand(n, 4)``).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from looptune.data.augment import (
    RandomAffine,
    _PilRandomAffine,
    _torchvision_transforms,
    apply_batch,
    draw_params_batch,
    draw_params_per_sample,
)
from looptune.errors import ConfigError

AUG = RandomAffine()  # degrees=10, translate=0.1, scale=(0.9, 1.1): the MNIST workload's setting
N_DRAWS = 20_000
SE_BOUND = 5.0  # |difference| < 5 standard errors: ~6e-7 two-sided chance per check if equal
KS_C = 1.95  # two-sample KS critical coefficient at alpha = 0.001

# Pixel agreement of the batched warp with PIL, found by hand (20 digits, 200+ parameter sets):
# - parameters drawn from AUG (continuous angle and scale): min 99.87%, mean 99.999%.
# - the "round" grid below: min 97.8%. At angle 0 with scale 0.9 or 1.1, whole rows/columns of
#   sample points land exactly on pixel boundaries (4.5 / 0.9 = 5, 5.5 / 1.1 = 5); PIL floors
#   fixed-point coordinates, grid_sample rounds half-to-even, so such ties go either way.
# A wrong convention (direction, center, half-pixel offset) drops far below both bounds.
RANDOM_MIN_AGREEMENT = 0.995
GRID_MIN_AGREEMENT = 0.97
GRID = list(itertools.product([0.0, 7.0, -9.5], [-2, 0, 3], [1, -3], [0.9, 1.0, 1.1]))


def _digit(seed: int) -> Image.Image:
    """A 28x28 'L' image with a few thick strokes and a loop, on black, like an MNIST digit."""
    rng = np.random.default_rng(seed)
    img = Image.new("L", (28, 28), 0)
    draw = ImageDraw.Draw(img)
    for _ in range(3):
        points = [tuple(rng.uniform(5, 23, 2)) for _ in range(3)]
        draw.line(points, fill=int(rng.integers(150, 256)), width=int(rng.integers(2, 4)))
    x0, y0 = rng.uniform(6, 16, 2)
    draw.ellipse([x0, y0, x0 + 6, y0 + 6], outline=255, width=2)
    return img


def _pil_warp(img: Image.Image, *params) -> np.ndarray:
    return np.asarray(_PilRandomAffine(AUG)._apply(img, *params), dtype=np.float32)


def _batch_warp(img: Image.Image, *params) -> np.ndarray:
    x = torch.from_numpy(np.asarray(img, dtype=np.float32))[None]
    return apply_batch(x, *params)[0].numpy()


def _near_miss_only(pil: np.ndarray, batch: np.ndarray) -> bool:
    """Each differing pixel of the batch output is a PIL value at most one pixel away."""
    padded = np.pad(pil, 1)
    for r, c in np.argwhere(pil != batch):
        if batch[r, c] not in padded[r:r + 3, c:c + 3]:
            return False
    return True


@pytest.mark.parametrize("seed", range(4))
def test_batch_matches_pil_on_a_parameter_grid(seed):
    img = _digit(seed)
    for params in GRID:
        pil, batch = _pil_warp(img, *params), _batch_warp(img, *params)
        agreement = float((pil == batch).mean())
        assert agreement >= GRID_MIN_AGREEMENT, (params, agreement)
        assert _near_miss_only(pil, batch), params


def test_batch_matches_pil_for_drawn_parameters():
    torch.manual_seed(0)
    for seed in range(40):
        img, params = _digit(seed), draw_params_per_sample(AUG, 28, 28)
        pil, batch = _pil_warp(img, *params), _batch_warp(img, *params)
        assert float((pil == batch).mean()) >= RANDOM_MIN_AGREEMENT, params
        assert _near_miss_only(pil, batch), params


@pytest.mark.parametrize("tx, ty", [(3, 0), (0, -2), (-2, 1), (1, 3)])
def test_integer_translation_matches_exactly_and_moves_right_and_down(tx, ty):
    img = _digit(7)
    pil, batch = _pil_warp(img, 0.0, tx, ty, 1.0), _batch_warp(img, 0.0, tx, ty, 1.0)
    np.testing.assert_array_equal(pil, batch)
    src = np.asarray(img, dtype=np.float32)
    expected = np.zeros_like(src)  # +tx moves content right, +ty down
    expected[max(ty, 0):28 + min(ty, 0), max(tx, 0):28 + min(tx, 0)] = \
        src[max(-ty, 0):28 + min(-ty, 0), max(-tx, 0):28 + min(-tx, 0)]
    np.testing.assert_array_equal(batch, expected)


def test_positive_angle_turns_clockwise_on_screen_in_both_paths():
    img = Image.new("L", (28, 28), 0)
    img.putpixel((20, 14), 255)  # right of the center (14, 14)
    for warped in (_pil_warp(img, 90.0, 0, 0, 1.0), _batch_warp(img, 90.0, 0, 0, 1.0)):
        assert np.argwhere(warped).tolist() == [[20, 13]]  # now below it: row 20


def test_identity_returns_the_input_exactly():
    x = torch.rand(5, 2, 28, 28, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(apply_batch(x, 0.0, 0.0, 0.0, 1.0), x, rtol=0, atol=0)
    img = _digit(1)
    np.testing.assert_array_equal(_pil_warp(img, 0.0, 0, 0, 1.0), np.asarray(img))


def _draws() -> tuple[np.ndarray, np.ndarray]:
    """N_DRAWS parameter sets per path, as float64 arrays of shape [N_DRAWS, 4]."""
    torch.manual_seed(1)
    per_sample = np.array([draw_params_per_sample(AUG, 28, 28) for _ in range(N_DRAWS)])
    gen = torch.Generator().manual_seed(2)
    batched = torch.stack(draw_params_batch(AUG, N_DRAWS, 28, 28, "cpu", gen), dim=1)
    return per_sample, batched.double().numpy()


@pytest.fixture(scope="module")
def draws() -> tuple[np.ndarray, np.ndarray]:
    return _draws()


def _rounded_uniform_pmf(m: float) -> tuple[np.ndarray, np.ndarray]:
    """Values and probabilities of round(U(-m, m)) (ties have probability 0)."""
    k = np.arange(-math.ceil(m), math.ceil(m) + 1)
    width = np.clip(np.minimum(k + 0.5, m) - np.maximum(k - 0.5, -m), 0, None)
    return k, width / (2 * m)


def _theory() -> list[tuple[float, float, float]]:
    """(mean, variance, 4th central moment) of angle, tx, ty, scale under AUG."""
    def uniform(lo, hi):
        h = (hi - lo) / 2
        return (lo + hi) / 2, h * h / 3, h ** 4 / 5
    k, p = _rounded_uniform_pmf(AUG.translate * 28)
    var = float((p * k * k).sum())
    shift = (0.0, var, float((p * k ** 4).sum()))
    return [uniform(-AUG.degrees, AUG.degrees), shift, shift, uniform(*AUG.scale)]


@pytest.mark.parametrize("col, name", list(enumerate(["angle", "tx", "ty", "scale"])))
def test_each_path_matches_the_theory(draws, col, name):
    mean, var, mu4 = _theory()[col]
    for sample in (d[:, col] for d in draws):
        se_mean = math.sqrt(var / len(sample))
        se_var = math.sqrt((mu4 - var * var) / len(sample))
        assert abs(sample.mean() - mean) < SE_BOUND * se_mean, name
        assert abs(sample.var(ddof=1) - var) < SE_BOUND * se_var, name


def _mean_var_se(x: np.ndarray) -> tuple[float, float, float, float]:
    centered = x - x.mean()
    var = float((centered ** 2).mean())
    mu4 = float((centered ** 4).mean())
    return float(x.mean()), var, var / len(x), (mu4 - var * var) / len(x)


@pytest.mark.parametrize("col, name", list(enumerate(["angle", "tx", "ty", "scale"])))
def test_the_two_paths_agree_with_each_other(draws, col, name):
    (m1, v1, sm1, sv1), (m2, v2, sm2, sv2) = (_mean_var_se(d[:, col]) for d in draws)
    assert abs(m1 - m2) < SE_BOUND * math.sqrt(sm1 + sm2), name
    assert abs(v1 - v2) < SE_BOUND * math.sqrt(sv1 + sv2), name
    a, b = draws[0][:, col], draws[1][:, col]
    assert _ks_statistic(a, b) < KS_C * math.sqrt((len(a) + len(b)) / (len(a) * len(b))), name


def _ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """sup |F_a - F_b| over all values (right-continuous CDFs, so ties are handled)."""
    values = np.union1d(a, b)
    cdf_a = np.searchsorted(np.sort(a), values, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), values, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


def test_draws_stay_in_range_and_shifts_are_whole_pixels(draws):
    for d in draws:
        assert np.abs(d[:, 0]).max() <= AUG.degrees
        assert np.all(d[:, 1:3] == np.round(d[:, 1:3]))
        assert set(np.unique(d[:, 1:3])) == set(range(-3, 4))  # round(U(-2.8, 2.8))
        assert AUG.scale[0] <= d[:, 3].min() and d[:, 3].max() <= AUG.scale[1]


def test_ks_statistic_sees_a_different_distribution(draws):
    # the bound is not vacuous: a 10% wider angle range fails it
    angles = draws[0][:, 0]
    bound = KS_C * math.sqrt(2 / len(angles))
    assert _ks_statistic(angles, angles * 1.1) > bound


@pytest.mark.parametrize("shape", [(16, 28, 28), (16, 1, 28, 28), (16, 3, 20, 24)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batch_keeps_shape_dtype_device(shape, dtype):
    x = torch.rand(shape, dtype=dtype, generator=torch.Generator().manual_seed(0))
    out = AUG.batch(x, generator=torch.Generator().manual_seed(1))
    assert (out.shape, out.dtype, out.device) == (x.shape, x.dtype, x.device)
    if len(shape) == 4 and shape[1] == 3:  # every channel gets its sample's one warp
        same = AUG.batch(x[:, :1].expand(shape).contiguous(), torch.Generator().manual_seed(1))
        torch.testing.assert_close(same[:, 0], same[:, 2], rtol=0, atol=0)


def test_batch_draws_per_sample_and_is_deterministic_given_a_generator():
    x = torch.from_numpy(np.asarray(_digit(3), dtype=np.float32)).expand(64, 28, 28)
    out = AUG.batch(x, torch.Generator().manual_seed(5))
    assert len({tuple(o.flatten().tolist()) for o in out}) >= 60  # not one warp for the batch
    torch.testing.assert_close(AUG.batch(x, torch.Generator().manual_seed(5)), out,
                               rtol=0, atol=0)
    assert not torch.equal(AUG.batch(x, torch.Generator().manual_seed(6)), out)
    angle = draw_params_batch(AUG, 64, 28, 28, "cpu", torch.Generator().manual_seed(5))[0]
    assert len(set(angle.tolist())) == 64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to check syncs")
def test_batch_on_cuda_makes_no_host_sync():
    x = torch.from_numpy(np.asarray(_digit(2), dtype=np.float32)).expand(256, 1, 28, 28).cuda()
    gen = torch.Generator(device="cuda").manual_seed(0)
    AUG.batch(x, gen)  # warm-up: first calls may initialise kernels
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = AUG.batch(x, gen)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert (out.shape, out.dtype, out.device) == (x.shape, x.dtype, x.device)
    params = draw_params_batch(AUG, 256, 28, 28, "cuda", torch.Generator("cuda").manual_seed(1))
    on_cpu = apply_batch(x.cpu(), *(p.cpu() for p in params))
    assert float((apply_batch(x, *params).cpu() == on_cpu).float().mean()) >= 0.999


def test_per_sample_draws_as_draw_params_per_sample():
    img, transform = _digit(4), AUG.per_sample()
    torch.manual_seed(11)
    out = np.asarray(transform(img))
    torch.manual_seed(11)
    params = draw_params_per_sample(AUG, 28, 28)
    np.testing.assert_array_equal(out, _pil_warp(img, *params))
    assert transform(img).size == img.size and transform(img).mode == "L"


@pytest.mark.vision
def test_torchvision_and_fallback_give_identical_images(torchvision_transforms):
    transforms = torchvision_transforms
    assert _torchvision_transforms() is transforms  # what per_sample() picks when it imports
    tv = transforms.RandomAffine(AUG.degrees, translate=(AUG.translate,) * 2, scale=AUG.scale)
    ours = _PilRandomAffine(AUG)
    for seed in range(50):
        img = _digit(seed)
        torch.manual_seed(seed)
        expected = np.asarray(tv(img))
        torch.manual_seed(seed)
        np.testing.assert_array_equal(np.asarray(ours(img)), expected)


def test_problems_name_the_bad_values():
    bad = RandomAffine(degrees=-5.0, translate=1.5, scale=(1.2, 1.0))
    found = bad.problems()
    assert len(found) == 3
    assert found[0].startswith("degrees=-5.0 is invalid: must be >= 0")
    assert found[1].startswith("translate=1.5 is invalid")
    assert found[2].startswith("scale=(1.2, 1.0) is invalid: must be (low, high) with 0 < low")
    assert RandomAffine().problems() == []
    with pytest.raises(ConfigError) as err:
        bad.per_sample()
    assert err.value.problems == found
    with pytest.raises(ConfigError, match="degrees=-5.0"):
        bad.batch(torch.zeros(2, 28, 28))


def test_batch_rejects_non_float_images_with_the_fix():
    with pytest.raises(ConfigError, match=r"dtype=torch.uint8.*x.float\(\)"):
        AUG.batch(torch.zeros(2, 28, 28, dtype=torch.uint8))
    with pytest.raises(ConfigError, match=r"shape=\(28, 28\)"):
        apply_batch(torch.zeros(28, 28), 0.0, 0.0, 0.0, 1.0)


def test_describe_is_one_line():
    assert AUG.describe() == "RandomAffine(degrees=10, translate=0.1, scale=(0.9, 1.1))"
