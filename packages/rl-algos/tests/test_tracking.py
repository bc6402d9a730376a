"""Metrics tracking: the JSONL log (with resume truncation), console lines, PNG plots."""

from __future__ import annotations

import json
import sys

import pytest

from rl_algos.trainer.tracking import MetricsLogger, plot_metrics, read_jsonl

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(logger: MetricsLogger, steps: range) -> None:
    for step in steps:
        logger.log(step, {"critic/score/mean": step / 10, "timing/step_s": 1.0})
    logger.close()


def test_jsonl_rows_and_value_filtering(tmp_path):
    logger = MetricsLogger(["jsonl"], tmp_path)
    logger.log(
        1,
        {
            "a": 1,
            "b": 2.5,
            "nan": float("nan"),
            "inf": float("inf"),
            "text": "not a number",
            "flag": True,
        },
    )
    logger.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"step": 1, "a": 1.0, "b": 2.5, "flag": 1.0}]


def test_jsonl_resume_drops_the_steps_after_the_checkpoint(tmp_path):
    _run(MetricsLogger(["jsonl"], tmp_path), range(1, 6))  # the interrupted run logged 1..5
    # resumed from the checkpoint of step 3: steps 4 and 5 are redone
    _run(MetricsLogger(["jsonl"], tmp_path, resume_step=3), range(4, 7))
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["critic/score/mean"] for r in rows] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]


def test_jsonl_fresh_run_overwrites_an_old_log(tmp_path):
    _run(MetricsLogger(["jsonl"], tmp_path), range(1, 4))
    _run(MetricsLogger(["jsonl"], tmp_path), range(1, 2))
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1]


def test_resume_without_an_old_log_starts_one(tmp_path):
    _run(MetricsLogger(["jsonl"], tmp_path / "new", resume_step=3), range(4, 5))
    assert [r["step"] for r in read_jsonl(tmp_path / "new" / "metrics.jsonl")] == [4]


def test_console_prints_the_key_metrics(tmp_path, capsys):
    logger = MetricsLogger(["console"], tmp_path)
    logger.log(7, {"critic/score/mean": 0.25, "actor/pg_loss": -0.5, "other/metric": 3.0})
    logger.close()
    out = capsys.readouterr().out.strip()
    assert out.startswith("step 7:")
    assert "score=0.25" in out and "actor/pg_loss=-0.5" in out and "other" not in out
    assert not (tmp_path / "metrics.jsonl").exists()


def test_unknown_backend_names_the_choices(tmp_path):
    with pytest.raises(ValueError, match=r"trainer.loggers: unknown backend 'csv'.*jsonl"):
        MetricsLogger(["jsonl", "csv"], tmp_path)


def test_configured_but_missing_tracker_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    with pytest.raises(ImportError, match="pip install tensorboard"):
        MetricsLogger(["tensorboard"], tmp_path)
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match="pip install wandb"):
        MetricsLogger(["wandb"], tmp_path)


def test_plot_metrics_writes_a_png_of_the_present_keys(tmp_path):
    logger = MetricsLogger(["jsonl"], tmp_path)
    for step in range(1, 5):
        metrics = {"critic/score/mean": step / 4, "actor/entropy": 2.0 - step / 10}
        if step % 2 == 0:
            metrics["val/accuracy"] = step / 8
        logger.log(step, metrics)
    logger.close()
    png = tmp_path / "metrics.png"
    drawn = plot_metrics(tmp_path / "metrics.jsonl", png)
    assert drawn == ["critic/score/mean", "val/accuracy", "actor/entropy"]
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    # the PNG is as tall as the number of panels: 3 panels of 2.4 in at 110 dpi
    height = int.from_bytes(data[20:24], "big")
    assert height == pytest.approx(3 * 2.4 * 110, abs=2)


def test_plot_metrics_without_any_key_draws_nothing(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "x": 1.0}) + "\n")
    assert plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "m.png") == []
    assert not (tmp_path / "m.png").exists()
