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
