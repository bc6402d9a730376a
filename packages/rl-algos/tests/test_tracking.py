"""Metrics tracking: the JSONL log (with resume truncation), console lines, PNG plots, and
the real trackers on local stores, also when a failover rewinds the run."""

from __future__ import annotations

import json
import sys
import time

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
            metrics["val/boxed"] = step / 16
        logger.log(step, metrics)
    logger.close()
    png = tmp_path / "metrics.png"
    drawn = plot_metrics(tmp_path / "metrics.jsonl", png)
    assert drawn == ["critic/score/mean", "val/accuracy", "val/boxed", "actor/entropy"]
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    # the PNG is as tall as the number of panels: 4 panels of 2.4 in at 110 dpi
    height = int.from_bytes(data[20:24], "big")
    assert height == pytest.approx(4 * 2.4 * 110, abs=2)


def test_plot_metrics_without_any_key_draws_nothing(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "x": 1.0}) + "\n")
    assert plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "m.png") == []
    assert not (tmp_path / "m.png").exists()


# ---- the real trackers, with local stores (the dev environment installs rl-algos[trackers])

STEPS = {1: {"val/pass@2": 0.5, "actor/loss": -1.25}, 2: {"val/pass@2": 0.75, "actor/loss": 0.5}}


def _log_steps(logger: MetricsLogger) -> None:
    for step, metrics in STEPS.items():
        logger.log(step, {**metrics, "skipped/nan": float("nan")})
    logger.close()


def test_tensorboard_event_files_hold_every_step(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log_steps(MetricsLogger(["tensorboard"], tmp_path))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"val/pass@2", "actor/loss"}  # NaN dropped
    for key in ("val/pass@2", "actor/loss"):
        got = [(e.step, e.value) for e in events.Scalars(key)]
        assert got == [(s, pytest.approx(m[key])) for s, m in STEPS.items()]


def test_mlflow_local_store_holds_params_and_metric_history(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    logger = MetricsLogger(
        ["mlflow"], tmp_path, project="proj", run_name="run-a", config={"actor": {"lr": 0.01}}
    )
    run_id = mlflow.active_run().info.run_id
    _log_steps(logger)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.data.params == {"actor.lr": "0.01"}
    assert run.info.run_name == "run-a" and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "proj"
    history = client.get_metric_history(run_id, "val/pass_at_2")  # "@" is not allowed there
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.75)]
    assert "skipped/nan" not in run.data.metrics


def _wandb_records(path):
    """The records of a .wandb file (LevelDB log framing: 7-byte header, then per record
    crc32(4) length(2, little endian) type(1) in 32 KiB blocks), parsed with wandb's own
    protobuf classes."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, records, pending = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer
            pos += block - pos % block
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
        elif kind == 0:
            break
    return records


def _wandb_history(tmp_path) -> tuple[list[dict], list]:
    """(history rows without W&B's own keys, every record) of the offline run's file."""
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 60  # wandb-core finishes writing the file asynchronously
    while True:
        records = _wandb_records(run_file)
        kinds = [r.WhichOneof("record_type") for r in records]
        if "exit" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert "exit" in kinds, f"the offline run file was not finished: {kinds}"
    history = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            history.append({k: v for k, v in items.items() if not k.startswith("_")})
    return history, records


@pytest.fixture
def wandb_offline(monkeypatch):
    """W&B installed (the trackers extra), writing its run files offline and quietly."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_wandb_offline_run_records_every_step(tmp_path, wandb_offline):
    _log_steps(MetricsLogger(["wandb"], tmp_path, project="proj", run_name="run-w"))
    history, records = _wandb_history(tmp_path)
    assert history == [{**m, "trainer/step": s} for s, m in STEPS.items()]
    # the training step is every chart's x-axis
    metrics = [r.metric for r in records if r.WhichOneof("record_type") == "metric"]
    assert any(m.glob_name == "*" and m.step_metric == "trainer/step" for m in metrics), metrics


# ---- a failover rewinds the run: steps 1-4 logged, back to step 2, steps 3-5 (replayed 3-4)


def _rewound(logger: MetricsLogger) -> None:
    for step in range(1, 5):
        logger.log(step, {"critic/score/mean": step / 10})
    logger.rewind(4)  # a snapshot of the last step: nothing is replayed
    logger.rewind(2)
    for step in range(3, 6):
        logger.log(step, {"critic/score/mean": step})
    logger.close()


def test_a_rewind_without_replayed_steps_changes_nothing(tmp_path):
    logger = MetricsLogger(["jsonl"], tmp_path)
    logger.log(1, {"a": 1.0})
    logger.rewind(1)
    logger.log(2, {"a": 2.0})
    logger.close()
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]


def test_jsonl_and_console_follow_a_rewind(tmp_path, capsys):
    _rewound(MetricsLogger(["jsonl", "console"], tmp_path))
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["critic/score/mean"]) for r in rows] == [
        (1, 0.1), (2, 0.2), (3, 3.0), (4, 4.0), (5, 5.0)
    ]  # fmt: skip
    assert "failover: back to step 2; steps 3-4 are replayed" in capsys.readouterr().out


def test_tensorboard_hides_the_lost_timeline(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _rewound(MetricsLogger(["tensorboard"], tmp_path))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    got = [(e.step, e.value) for e in events.Scalars("critic/score/mean")]
    assert got == [(1, pytest.approx(0.1)), (2, pytest.approx(0.2)), (3, 3.0), (4, 4.0), (5, 5.0)]


def test_wandb_marks_the_replayed_steps(tmp_path, wandb_offline):
    _rewound(MetricsLogger(["wandb"], tmp_path, project="proj", run_name="run-r"))
    history, records = _wandb_history(tmp_path)
    rows = [
        (h["trainer/step"], h["critic/score/mean"], h.get("failover/replayed")) for h in history
    ]
    assert rows == [
        (1, 0.1, None), (2, 0.2, None), (3, 0.3, None), (4, 0.4, None),
        (3, 3, 1), (4, 4, 1), (5, 5, None),
    ]  # fmt: skip
    summaries = [r.summary for r in records if r.WhichOneof("record_type") == "summary"]
    assert any(
        (i.key or "/".join(i.nested_key)) == "failover/rewinds" and json.loads(i.value_json) == 1
        for s in summaries
        for i in s.update
    ), summaries


def test_mlflow_keeps_both_timelines_and_says_which_is_the_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    logger = MetricsLogger(["mlflow"], tmp_path, project="proj", run_name="run-m")
    run_id = mlflow.active_run().info.run_id
    _rewound(logger)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    history = client.get_metric_history(run_id, "critic/score/mean")
    assert sorted((m.step, m.value) for m in history) == [
        (1, 0.1), (2, 0.2), (3, 0.3), (3, 3.0), (4, 0.4), (4, 4.0), (5, 5.0)
    ]  # fmt: skip
    replayed = client.get_metric_history(run_id, "failover/replayed")
    assert sorted(m.step for m in replayed) == [3, 4]
    tags = client.get_run(run_id).data.tags
    assert "steps 3-4 logged twice" in tags["failover.rewind.1"]
