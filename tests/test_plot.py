"""The pictures users attach to a bug report: `gpumon analyze --plot` and the demo's plot (the same
drawing with the demo's phase change marked), checked with matplotlib's own geometry: no legend
over a title or the data, nothing outside the figure, every change of state marked, and the
shading the report's own episodes, to the tenth of a second the text prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpumon.analyze.plot import draw
from gpumon.analyze.trace_report import Analysis, analyze, render_text

from .conftest import ROOT

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def analysis(tmp_path_factory: pytest.TempPathFactory) -> Analysis:
    """90 s of a GPU fed for 30 s then CPU-starved, beside a healthy one and an IO-starved one."""
    trace = tmp_path_factory.mktemp("plot") / "t.jsonl"
    fleet = "healthy-then-starved,healthy,starved-io"
    args = ["record", "--simulate", fleet, "--duration", "90", "--speed", "max", "-o", str(trace)]
    p = subprocess.run(
        [sys.executable, "-m", "gpumon", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    return analyze(str(trace))


DEMO_MARK = (45.0, "demo: starved phase starts")


def boxes(fig: Any) -> dict[str, Any]:
    """Window-space bounding boxes of what must not overlap."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found: dict[str, Any] = {"suptitle": fig._suptitle.get_window_extent(renderer)}
    for i, ax in enumerate(fig.axes):
        found[f"axes {i}"] = ax.get_window_extent(renderer)  # the data area
        found[f"title {i}"] = ax.title.get_window_extent(renderer)
        legend = ax.get_legend()
        if legend is not None:
            found[f"legend {i}"] = legend.get_window_extent(renderer)
    return found


@pytest.mark.parametrize("marks", [(), (DEMO_MARK,)], ids=["analyze", "demo"])
def test_no_legend_covers_a_title_or_the_data_and_nothing_is_cut(analysis: Analysis, marks: tuple) -> None:
    fig = draw(analysis, marks)
    try:
        found = boxes(fig)
        legends = {k: b for k, b in found.items() if k.startswith("legend")}
        assert len(legends) == 2, "one legend for the GPUs, one for the host"
        for name, box in legends.items():
            for other, obox in found.items():
                if other != name:
                    assert not box.overlaps(obox), f"{name} over {other}"
        figure = fig.bbox
        for name, box in found.items():
            inside = (
                figure.x0 <= box.x0 and box.x1 <= figure.x1 and figure.y0 <= box.y0 and box.y1 <= figure.y1
            )
            assert inside, f"{name} cut at the figure's edge"
        titles = [k for k in found if k.startswith("title")] + ["suptitle"]
        for a in titles:
            for b in titles:
                assert a == b or not found[a].overlaps(found[b]), (a, b)
    finally:
        fig.clf()


def spans(ax: Any) -> list[tuple[str, float, float]]:
    return [
        (gid.split()[1], float(gid.split()[2]), float(gid.split()[3]))
        for p in ax.patches
        if (gid := p.get_gid() or "").startswith("episode ")
    ]


def test_the_shading_is_the_reports_episodes_and_each_change_is_marked(analysis: Analysis) -> None:
    """The text dated the starved episode from 30 s while the shading began at the first verdict
    naming it (3 s later, the state's hold): both now come from the same episodes."""
    text = render_text(analysis)
    fig = draw(analysis, (DEMO_MARK,))
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        per_gpu = text.split("\nGPU ")[1:]
        assert len(per_gpu) == 3
        for ax, block in zip(fig.axes, per_gpu):
            printed = [
                (label, float(start), float(end))
                for start, end, label in re.findall(r"^\s+([\d.]+) -\s+([\d.]+) s\s+(\S+)", block, re.M)
            ]
            shaded = [s for s in spans(ax) if s[0] != "unknown"]
            assert shaded == printed, block
            for label, start, end in shaded:  # and where they are drawn, to a pixel
                patch = next(p for p in ax.patches if p.get_gid() == f"episode {label} {start:.1f} {end:.1f}")
                box = patch.get_window_extent(renderer)
                x0, x1 = ax.transData.inverted().transform([[box.x0, 0], [box.x1, 0]])[:, 0]
                per_pixel = (ax.get_xlim()[1] - ax.get_xlim()[0]) / ax.get_window_extent(renderer).width
                assert abs(x0 - start) <= 2 * per_pixel and abs(x1 - end) <= 2 * per_pixel
            changes = sorted(
                float(ln.get_gid().split()[1])
                for ln in ax.lines
                if (ln.get_gid() or "").startswith("change ")
            )
            assert changes == [s[1] for s in shaded[1:]], "every change of state is marked, nothing else"
        starved = spans(fig.axes[0])[-1]
        assert starved[0] == "starved-cpu" and 29 <= starved[1] <= 33, starved
        for ax in fig.axes:
            marked = [ln for ln in ax.lines if ln.get_gid() == f"mark {DEMO_MARK[0]:.1f}"]
            assert len(marked) == 1, "the demo's phase change is marked on every plot"
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert "change of state" in labels and "demo: starved phase starts (45 s)" in labels, labels
    finally:
        fig.clf()


def test_the_picture_in_the_docs_is_the_projects_own() -> None:
    """README's first screen shows it; docs/usage.md says how it was made."""
    picture = ROOT / "docs/images/analyze-starved-cpu.png"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "docs/images/analyze-starved-cpu.png" in (ROOT / "README.md").read_text()
    made = (ROOT / "docs/usage.md").read_text()
    assert "--plot docs/images/analyze-starved-cpu.png" in made


def test_plot_writes_a_png(analysis: Analysis, tmp_path: Path) -> None:
    from gpumon.analyze.plot import plot

    out = tmp_path / "p.png"
    plot(analysis, str(out), (DEMO_MARK,))
    assert out.read_bytes()[:4] == b"\x89PNG"
