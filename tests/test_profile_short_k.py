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
