"""Observability on a real run: a 2-worker RobustTrainer with an injected kill, hang and NaN
on a local Ray cluster started with a known metrics export port. The run's events, its HTML
report (data embedded in the page, and the page rendered by headless Chromium) and the
metrics scraped from Ray's Prometheus endpoint must all tell the same story."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request

import pytest

import rayguard
from rayguard.events.read import iter_events, locate, read_log
from rayguard.observe.report import embedded_data, write_report
from rayguard.testing.recorder import make_trainer

FAULTS = "kill:rank=1,step=6;hang:rank=0,step=12;nan:rank=0,step=18"
STEPS = 24
# its own local Ray instance (a known metrics port, a short report interval): run after the
# shared cluster's tests (tests/conftest.py)
pytestmark = pytest.mark.own_cluster

STALL_S = 6.0
"""The hang costs the run this long. The bound holds from an attempt's first completed step
(set-up and the restore are under the start-up bound), where a step here is 50 ms: 6 s is
still 120 of them (tests/ray/test_recovery_exact.py and test_hang_diagnosis.py use 5 s and
4 s)."""


def faulty_loop(config):
    import torch

    ctx = rayguard.train.get_context()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = rayguard.train.load_state()
    start = 0 if state is None else state["step"] + 1
    if state is not None:
        model.module.load_state_dict(state["model"])
    for step in range(start, config["steps"]):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.05)
        save = step % 3 == 2 and ctx.rank == 0
        state = {"model": model.module.state_dict(), "step": step}
        rayguard.train.report({"loss": loss.item(), "step": step}, state=state if save else None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("ray_rayguard_"):
                labels = tuple(sorted((k, v) for k, v in sample.labels.items()
                                      if k in ("run", "cause", "rank", "phase")))
                out[(sample.name, labels)] = sample.value
    return out


class Scraper(threading.Thread):
    """Scrapes the endpoint every second during the run; keeps the last value of each series."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port, self.seen, self.errors = port, {}, []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            try:
                self.seen.update(scrape(self.port))
            except Exception as exc:  # the endpoint starts a little after Ray
                self.errors.append(repr(exc))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import ray

    if ray.is_initialized():
        ray.shutdown()
    port = _free_port()
    # like conftest.start_local_ray, plus a known metrics port and a short report interval
    ray.init(address="local", num_cpus=4, object_store_memory=512 * 1024**2,
             include_dashboard=False, _metrics_export_port=port,
             _system_config={"metrics_report_interval_ms": 500})
    scraper = Scraper(port)
    scraper.start()
    tmp = tmp_path_factory.mktemp("observe")
    health = rayguard.HealthConfig(stall_timeout_s=STALL_S, step_summary_interval_s=0.5,
                                   straggler_window_s=5.0)
    guard = rayguard.GuardConfig(seed=0, numa="off", faults=FAULTS, health=health)
    trainer = make_trainer(faulty_loop, tmp, config={"steps": STEPS}, guard=guard,
                           name="observed")
    result = trainer.fit()
    time.sleep(3)  # two metric report intervals after the end
    scraper.done.set()
    scraper.join()
    try:
        scraper.seen.update(scrape(port))
    except Exception as exc:
        scraper.errors.append(repr(exc))
    yield {"path": result.path, "tmp": tmp, "metrics": scraper.seen, "errors": scraper.errors,
           "goodput": trainer.last_goodput}
    ray.shutdown()  # the next module gets the plain shared cluster


def _expected_causes(causes) -> bool:
    """One restart per injected fault. A loaded machine may add a stall while a restarted
    group sets up (the fixed stall timeout covers set-up): that one is a hang too."""
    return causes.count("kill") == 1 and causes.count("nan") == 1 and causes.count("hang") >= 1 \
        and len(causes) == causes.count("kill") + causes.count("nan") + causes.count("hang")


def _events(path):
    return read_log(locate(path)).events


def test_every_failure_is_in_the_event_log_with_its_cause(run):
    events = _events(run["path"])
    kinds = [e["kind"] for e in events]
    for kind in ("start", "attempt_started", "checkpoint_committed", "worker_died", "restart",
                 "stall_detected", "nan_detected", "restored", "steps", "finished"):
        assert kind in kinds, kind
    causes = [e["cause"] for e in events if e["kind"] == "restart"]
    assert _expected_causes(causes), causes
    committed = [e for e in events if e["kind"] == "checkpoint_committed"]
    assert all(e["seconds"] >= 0 and e["bytes"] > 0 for e in committed)


def _printed(run_cli, argv):
    done = run_cli(argv)
    assert done.rc == 0, done.stderr
    return done.stdout


def test_rayguard_events_cli_prints_every_event(run, run_cli):
    events = _events(run["path"])
    cmd = ["events", run["path"]]
    table = _printed(run_cli, cmd)
    assert len(table.splitlines()) == len(events) + 1
    as_json = _printed(run_cli, cmd + ["--json"])
    # streamed in the file's order (a live recovery's controller event may land after a
    # survivor's later step summary); read_log sorts by time
    in_file = [e["kind"] for e in iter_events(locate(run["path"]))]
    assert [json.loads(line)["kind"] for line in as_json.splitlines()] == in_file
    assert sorted(in_file) == sorted(e["kind"] for e in events)
    only = _printed(run_cli, cmd + ["--kind", "restart"])
    restarts = sum(e["kind"] == "restart" for e in events)
    assert len(only.splitlines()) == restarts + 1 and "cause: kill" in only


def test_report_embeds_attempts_restarts_and_checkpoints(run):
    out = write_report(run["path"], str(run["tmp"] / "report.html"))
    data = embedded_data(open(out).read())
    events = _events(run["path"])
    n = len(data["restarts"])
    assert [a["attempt"] for a in data["attempts"]] == list(range(n + 1))
    assert [a["outcome"] for a in data["attempts"]] == ["failed"] * n + ["finished"]
    assert _expected_causes([r["cause"] for r in data["restarts"]])
    for r in data["restarts"]:
        if r["cause"] in ("kill", "nan"):
            assert r["restored_step"] is not None and r["restored_step"] % 3 == 2
            assert r["cost_s"] is not None and r["cost_s"] > 0
    hang = next(r for r in data["restarts"] if r["cause"] == "hang")
    assert hang["detection_s"] == STALL_S
    marks = [c for c in data["checkpoints"] if c["status"] == "committed"]
    assert len(marks) == sum(e["kind"] == "checkpoint_committed" for e in events)
    assert sum(c["status"] == "restored" for c in data["checkpoints"]) >= 3
    fault_kinds = {f["kind"] for f in data["faults"]}
    assert {"died", "hang", "nan"} <= fault_kinds
    assert next(f for f in data["faults"] if f["kind"] == "hang")["stacks"]
    assert data["summary"]["restarts"] == n and data["summary"]["outcome"] == "finished"
    assert len(data["metric"]["series"]) >= 2  # the loss before and after a restart


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def test_report_renders_in_headless_chromium(run):
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium binary on PATH (Debian: apt-get install chromium; .ci/run does)")
    out = write_report(run["path"], str(run["tmp"] / "browser.html"))
    url = "file://" + os.path.abspath(out)
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--window-size=1400,1800", "--virtual-time-budget=15000",
             f"--user-data-dir={run['tmp'] / 'chromium-profile'}"]
    dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True,
                         timeout=180).stdout
    body = dom[dom.index("<body"):dom.index(">", dom.index("<body"))]
    assert 'data-script-errors="0"' in body, body
    assert 'data-plotly="loaded"' in body, body
    width, height = (int(v) for v in body.split('data-timeline-size="')[1].split('"')[0].split("x"))
    assert width > 100 and height > 100
    shot = run["tmp"] / "report.png"
    subprocess.run(flags + [f"--screenshot={shot}", url], capture_output=True, timeout=180)
    assert shot.exists() and shot.stat().st_size > 10_000


def test_metrics_on_rays_prometheus_endpoint(run):
    seen, run_name = run["metrics"], "observed"

    def value(name, **labels):
        key = (name, tuple(sorted({"run": run_name, **labels}.items())))
        return seen.get(key)

    assert seen, f"no rayguard series scraped; errors: {run['errors'][-3:]}"
    assert value("ray_rayguard_restarts_total", cause="kill") == 1
    assert value("ray_rayguard_restarts_total", cause="nan") == 1
    events = _events(run["path"])
    hangs = sum(e["kind"] == "restart" and e["cause"] == "hang" for e in events)
    assert value("ray_rayguard_restarts_total", cause="hang") == hangs >= 1
    assert value("ray_rayguard_stalls_total") == sum(e["kind"] == "stall_detected" for e in events)
    assert value("ray_rayguard_nan_events_total") == 1
    assert value("ray_rayguard_checkpoints_committed_total") >= 4
    assert value("ray_rayguard_checkpoint_bytes_total") > 0
    assert value("ray_rayguard_world_size") == 2
    assert value("ray_rayguard_attempt") == hangs + 2
    assert value("ray_rayguard_step_time_seconds", rank="0") > 0
    assert value("ray_rayguard_checkpoint_seconds_count", phase="blocked") >= 4


def test_goodput_of_a_run_with_a_kill_a_hang_and_a_nan(run, run_cli):
    from rayguard.observe.goodput import CAUSES, goodput

    events = _events(run["path"])
    g = goodput(events)
    restarts = sum(e["kind"] == "restart" for e in events)
    assert g.restarts == restarts >= 3 and len(g.attempts) == restarts + 1
    times = [e["time"] for e in events]
    assert g.wall_s == pytest.approx(max(times) - min(times))
    total = g.productive_s + sum(g.badput_s.values())
    assert abs(total - g.wall_s) <= 0.01 * g.wall_s
    assert 0 < g.ratio < 1 and g.productive_s > 0
    assert g.badput_s["restart"] > 0 and g.badput_s["startup"] > 0
    for phase in ("teardown", "worker_start", "setup", "load"):
        assert g.restart_s[phase] > 0, (phase, g.restart_s)
    assert g.replayed_steps >= 1 and g.badput_s["replay"] > 0
    assert g.badput_s["stall"] >= STALL_S  # the hang: its watchdog timeout
    assert g.badput_s["checkpoint"] > 0  # every commit here is synchronous: blocked_s
    # an attempt killed within its first step summary has no step time measured: only that
    # may be missing, every other phase is recorded
    assert all("replayed steps' time" in n for n in g.not_measured), g.not_measured
    # the driver's figures (RobustTrainer.last_goodput, its last line) are the log's
    assert run["goodput"] is not None and run["goodput"].ratio == pytest.approx(g.ratio)
    cmd = ["events", run["path"], "--goodput", "--json"]
    data = json.loads(_printed(run_cli, cmd))
    assert data["ratio"] == pytest.approx(g.ratio) and set(data["badput_s"]) == set(CAUSES)
    table = _printed(run_cli, cmd[:-1])
    assert table.startswith(f"goodput {g.ratio:.2f}") and "replay" in table


def test_goodput_metrics_on_rays_prometheus_endpoint(run):
    from rayguard.observe.goodput import goodput

    g = goodput(_events(run["path"]))
    key = ("run", "observed")
    ratio = run["metrics"].get(("ray_rayguard_goodput_ratio", (key,)))
    assert ratio == pytest.approx(g.ratio, rel=1e-3)
    restart = run["metrics"].get(("ray_rayguard_badput_seconds_total",
                                  (("cause", "restart"), key)))
    assert restart == pytest.approx(g.badput_s["restart"], rel=0.01)
