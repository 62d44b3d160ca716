"""A long run says once, early, how long the rest will take (issue 38): ``runlog.forecast_line`` and the progress
bar that prints it."""

import io

from vfltorch import runlog
from vfltorch.runlog import FORECAST_MIN, forecast_line


def test_the_line_names_the_time_left_and_how_it_was_measured():
    line = forecast_line("dpscd cyclic", "step", done=10, seconds=4.0, left=1190, total=1200)
    assert line.startswith("vfl: dpscd cyclic: about 7.9 min to go")
    assert "1190 of 1200 steps left at 0.4 s each, measured over 10" in line
    assert "h to go" in forecast_line("x", "it", done=1, seconds=3.0, left=10_000, total=10_001)


def test_short_runs_and_unknown_totals_say_nothing():
    assert forecast_line("x", "it", done=10, seconds=2.0, left=10, total=21) is None       # 2 s to go
    assert forecast_line("x", "it", done=10, seconds=2.0, left=10_000, total=None) is None
    assert forecast_line("x", "it", done=10, seconds=1.0, left=10_000, total=10_011) is None  # too little measured
    assert forecast_line("x", "it", done=1, seconds=FORECAST_MIN, left=1, total=3) == \
        forecast_line("x", "it", done=1, seconds=FORECAST_MIN, left=1, total=3)


def test_the_bar_prints_it_once(monkeypatch):
    clock = iter(float(t) for t in range(0, 1000, 1))
    monkeypatch.setattr("time.perf_counter", lambda: next(clock))
    out = io.StringIO()
    bar = runlog._bar_class()(total=500, desc="fdskl", unit="it", file=out, mininterval=0)
    for _ in range(10):
        bar.update(1)               # one second per step on this clock
    bar.close()
    text = out.getvalue()
    assert text.count("to go") == 1 and "fdskl: about" in text, text
