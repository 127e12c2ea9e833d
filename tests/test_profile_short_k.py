"""scripts/profile_short_k.py: its shapes, its line fit and its refusal to time WGRAD_DIAG bits on a release build."""

import importlib.util

import pytest

from helpers import ROOT

spec = importlib.util.spec_from_file_location("profile_short_k", ROOT / "scripts" / "profile_short_k.py")
profile_short_k = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile_short_k)


def test_grouped_shapes_are_the_layer_benchmarks_padded_splits():
    specs = profile_short_k.grouped_specs()
    for name, (m, n, ks, bf16) in specs.items():
        assert all(k % profile_short_k.PAD == 0 and k >= 0 for k in ks), name
        assert profile_short_k.TOKENS <= sum(ks) < profile_short_k.TOKENS + profile_short_k.PAD * len(ks), name
        assert name.startswith("bf16" if bf16 else "fp32") and f"{m}x{n}" in name
    assert sorted(len(ks) for _, _, ks, _ in specs.values()) == [8] * 4 + [32] * 5


def test_list_names_every_shape(capsys):
    assert profile_short_k.main(["list"]) == 0
    printed = capsys.readouterr().out.split("\n")
    assert [line for line in printed if line] == profile_short_k.shape_names()


def test_fit_line_recovers_slope_and_intercept():
    xs = [4, 8, 16, 32, 64]
    intercept, slope = profile_short_k.fit_line(xs, [1.5 + 0.25 * x for x in xs])
    assert intercept == pytest.approx(1.5) and slope == pytest.approx(0.25)
    with pytest.raises(ValueError, match="two distinct"):
        profile_short_k.fit_line([4, 4], [1.0, 2.0])


def test_waves_round_up_tiles_over_the_sms():
    assert profile_short_k.waves(4096, 4096, 128, 132) == 8  # 1024 tiles
    assert profile_short_k.waves(2048, 7168, 128, 132, groups=32) == 218  # 28672 tiles
    assert profile_short_k.waves(100, 100, 160, 132) == 1


def test_timing_modes_refuse_a_release_build(monkeypatch):
    from wgrad import _version

    monkeypatch.setitem(_version.BUILD, "diag_variants", False)
    with pytest.raises(SystemExit, match="measurement build"):
        profile_short_k.require_measurement_build()


def test_interpolate_reads_the_equal_groups_curve():
    curve = {32: 10.0, 128: 12.0, 512: 20.0}
    assert profile_short_k.interpolate(curve, 16) == 10.0  # below the first point: its value
    assert profile_short_k.interpolate(curve, 80) == pytest.approx(11.0)
    assert profile_short_k.interpolate(curve, 512) == 20.0
    assert profile_short_k.interpolate(curve, 1024) == pytest.approx(40.0)  # past the last: proportional to K_g


def test_splits_use_the_grouped_shapes_uneven_split():
    ks = profile_short_k.padded(profile_short_k.uneven_split_of(32))
    assert ks == profile_short_k.grouped_specs()["bf16 32x2048x7168 ~512"][2]
    rounded = profile_short_k.padded(ks, profile_short_k.BLOCK_K)
    assert all(r % 128 == 0 and 0 <= r - k < 128 for r, k in zip(rounded, ks))


def test_splits_time_every_variant_and_predict_from_the_equal_ones():
    variants = profile_short_k.split_variants([128, 512], [4, 5])
    labels = [label for label, _, _ in variants]
    assert labels[:2] == ["32 x 128", "32 x 512"] and len(variants) == 2 + 2 + 2 * 2
    for label, ks, equal in variants:
        assert len(ks) == profile_short_k.SPLIT_GROUPS and equal == (label in labels[:2])
    starts = {label: [sum(ks[:i]) % 128 for i in range(1, len(ks))] for label, ks, _ in variants}
    assert set(starts["31 x 640 + 32: starts on 128-token boundaries"]) == {0}
    assert set(starts["32 + 31 x 640: starts 32 tokens past them"]) == {32}

    # A fake timer at 1 us per token: each equal split reads as its K_g per group, the rest as predicted.
    lines = list(profile_short_k.split_lines(variants, lambda ks: sum(ks) / 1e3))
    assert len(lines) == len(variants)
    assert "128.00 us per group" in lines[0] and "512.00 us per group" in lines[1]
    rounded = variants[3][1]
    assert f"{sum(rounded) / 1e3:8.4f} ms" in lines[3]
    # Every rounded group is >= 128 tokens, where the fake's curve is exactly linear: prediction == time.
    assert lines[3].endswith(f"predicted from equal groups {sum(rounded) / 1e3:.4f} ms")
