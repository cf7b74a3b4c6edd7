"""``mmfl report RUN... --plot``: every run is drawn or named in a line saying why not, panels
have titles, rounds are integer ticks, equal curves stay distinguishable, and a personalized
mean accuracy is labelled as such. Figures are checked through their matplotlib properties
(Agg canvas), on hand-written metrics rows and run folders (no training)."""

import json

from mmfl.cli import main
from mmfl.report import accuracy_figure, accuracy_kind


def rows(accs, **extra):
    return [{"round": r + 1, "accuracy": a, **extra} for r, a in enumerate(accs)]


def write_run(folder, rows_, algo="fedavg", data="digits"):
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_))
    (folder / "config.toml").write_text(f'[algorithm]\nname = "{algo}"\n[data]\nname = "{data}"\n')
    return str(folder)


def test_short_run_has_integer_round_ticks_and_a_title():
    fig, notes = accuracy_figure({"a": rows([0.2, 0.4, 0.5])}, data="digits")
    (ax,) = fig.axes
    fig.canvas.draw()
    ticks = [t for t in ax.get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)  # before: 1.25, 1.5, ...
    assert ax.get_title() == "test accuracy per round (digits)" and ax.get_ylabel() == "test accuracy"
    assert notes == []


def test_identical_curves_get_distinct_styles_and_a_same_as_label():
    same = rows([0.3, 0.6])
    fig, _ = accuracy_figure({"fedavg": same, "fedprox-mu0": list(same), "moon": rows([0.3, 0.7])})
    (ax,) = fig.axes
    lines = ax.get_lines()
    assert len(lines) == 3
    assert len({(ln.get_linestyle(), ln.get_marker()) for ln in lines}) == 3
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["fedavg", "fedprox-mu0 (same as fedavg)", "moon"]


def test_personalized_mean_accuracy_is_labelled_as_such():
    personal = rows([0.5, 0.6], personal_test_rows=20.0, accuracy_std=0.1, client_accuracy=[0.5, 0.6])
    assert accuracy_kind(personal) == "personalized"
    fig, _ = accuracy_figure({"fedfomo": personal})
    assert fig.axes[0].get_ylabel().startswith("personalized mean accuracy")
    # mixed with a global model's accuracy: a generic axis, the kind in each legend label
    fig, _ = accuracy_figure({"fedfomo": personal, "fedavg": rows([0.4, 0.5])})
    ax = fig.axes[0]
    assert ax.get_ylabel() == "accuracy"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fedfomo (personalized mean)", "fedavg (test)"]
    # run.personal_eval's personal/accuracy is a second, labelled curve of the run
    both = [{**r, "personal/accuracy": r["accuracy"] + 0.1} for r in rows([0.4, 0.5])]
    fig, _ = accuracy_figure({"fedavg": both})
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["fedavg (test)",
                                                                          "fedavg (personalized mean)"]


def test_retrieval_runs_get_their_own_panel_next_to_accuracy_runs():
    r1 = [{"round": 1, "r1_sum": 10.0}, {"round": 2, "r1_sum": 12.5}]
    fig, notes = accuracy_figure({"fedavg": rows([0.4, 0.5]), "creamfl": r1})
    assert notes == [] and len(fig.axes) == 2  # before: the R@1-only run was dropped silently
    assert [ln.get_label() for ln in fig.axes[1].get_lines()] == ["creamfl"]
    assert fig.axes[1].get_title().startswith("R@1 sum")


def test_report_plot_names_each_run_it_cannot_draw(tmp_path, capsys):
    a = write_run(tmp_path / "runs" / "a", rows([0.2, 0.4]))
    b = write_run(tmp_path / "runs" / "b", [{"round": 1, "train_loss": 1.0}, {"round": 2, "train_loss": 0.5}])
    c = write_run(tmp_path / "other" / "a", rows([0.3, 0.5]))  # same folder name as the first run
    png = tmp_path / "cmp.png"
    assert main(["report", a, b, c, "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert ("not plotted: b: none of its 2 rows has accuracy or r1_sum (no evaluated round: "
            "eval_every > rounds?)") in out.splitlines()
    assert png.stat().st_size > 0


def test_report_keeps_both_curves_of_runs_with_one_folder_name(tmp_path, monkeypatch):
    import mmfl.report as report

    a = write_run(tmp_path / "seed0" / "run", rows([0.2, 0.4]))
    b = write_run(tmp_path / "seed1" / "run", rows([0.3, 0.5]))
    drawn = {}
    monkeypatch.setattr(report, "plot_accuracy", lambda curves, path, data=None: drawn.update(curves) or [])
    report.compare([a, b], plot_path=tmp_path / "x.png")
    assert sorted(drawn) == ["seed0/run", "seed1/run"]  # before: one replaced the other
