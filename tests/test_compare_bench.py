"""scripts/compare_bench.py: before/after of two benchmark documents."""

import importlib.util
import json

from helpers import ROOT

spec = importlib.util.spec_from_file_location("compare_bench", ROOT / "scripts" / "compare_bench.py")
compare_bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_bench)


def _doc(tflops, pct):
    return {"dense": [{"shape": "7168x2112x4096", "impl": "ours", "tflops": tflops},
                      {"shape": "7168x2112x4096", "impl": "bf16", "tflops": None}],
            "grouped": [], "quant": [{"name": "quantize_fp8_1x128_rowwise", "shape": [4096, 7168], "pct_of_copy": pct}]}


def test_rows_within_and_beyond_the_tolerance(tmp_path, capsys):
    before, after = tmp_path / "b.json", tmp_path / "a.json"
    before.write_text(json.dumps(_doc(800.0, 88.0)))
    after.write_text(json.dumps(_doc(790.0, 89.0)))
    assert compare_bench.main([str(before), str(after)]) == 0
    out = capsys.readouterr().out
    assert "dense 7168x2112x4096 ours" in out and "0.988" in out and "1.011" in out and "bf16" not in out
    after.write_text(json.dumps(_doc(700.0, 88.0)))
    assert compare_bench.main([str(before), str(after)]) == 1
    assert "moved by more than 2%" in capsys.readouterr().out


def test_a_document_of_the_older_format_compares_with_a_newer_one(tmp_path, capsys):
    # Older documents: published anchor figures in every GEMM row, no DeepGEMM row, no machine rates, no
    # bound or host-time keys; newer ones the reverse. Rows pair by (kind, shape, impl) all the same.
    old = _doc(800.0, 88.0)
    old["dense"][0].update(anchor="DeepGEMM", anchor_tflops=918.0, vs_anchor=800.0 / 918.0)
    new = _doc(808.0, 88.0)
    new["dense"][0].update(vs_deepgemm=0.9, pct_bound=80.0, binds="math", bound_ms=0.8, host_us=9.0)
    new["dense"].append({"shape": "7168x2112x4096", "impl": "deepgemm", "tflops": 900.0})
    new["machine_rates"] = {"fp8_tflops": 1300.0, "copy_gbps": 3000.0}
    before, after = tmp_path / "b.json", tmp_path / "a.json"
    before.write_text(json.dumps(old))
    after.write_text(json.dumps(new))
    assert compare_bench.main([str(before), str(after)]) == 0
    out = capsys.readouterr().out
    assert "dense 7168x2112x4096 ours" in out and "1.010" in out and "deepgemm" not in out
