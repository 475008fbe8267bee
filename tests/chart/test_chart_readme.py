"""The chart README is generated (hack/chart-readme.py) from values.yaml's `# --` comments;
Chart.yaml's index metadata names the images the chart deploys."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.chart.conftest import CHART, KUBE_MINORS, REPO

GENERATOR = REPO / "hack" / "chart-readme.py"
sys.path.insert(0, str(REPO / "hack"))
import chart_values  # noqa: E402


def test_committed_readme_equals_the_generator_output() -> None:
    proc = subprocess.run(
        [sys.executable, str(GENERATOR), "--stdout"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert (CHART / "README.md").read_text() == proc.stdout, "run hack/chart-readme.py"


def test_every_value_is_documented_and_in_the_table() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    docs = [d.path for d in chart_values.documented()]
    undocumented = [
        leaf
        for leaf in chart_values.leaves(values)
        if not any(leaf == d or leaf.startswith(d + ".") for d in docs)
    ]
    assert undocumented == []
    readme = (CHART / "README.md").read_text()
    for path in docs:
        assert f"\n| {path} |" in readme, path


def test_list_items_are_no_keys() -> None:
    docs = {d.path: d for d in chart_values.documented()}
    assert "poolDefaults.tolerations" in docs
    assert not any(p.startswith("poolDefaults.tolerations.") for p in docs)
    assert docs["poolDefaults.tolerations"].value[0]["key"] == "nvidia.com/gpu"
    assert docs["agentConfig.health.fatalXids"].description.endswith(
        "recovers after recoveryQuietSeconds."
    )


def test_chart_metadata_names_the_deployed_images() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    agent, sched = values["image"], values["scheduler"]["image"]
    images = yaml.safe_load(chart["annotations"]["artifacthub.io/images"])
    assert images == [
        {"name": "gpu-share",
         "image": f"{agent['registry']}/{agent['repository']}:{chart['appVersion']}"},
        {"name": "kube-scheduler",
         "image": f"{sched['registry']}/{sched['repository']}:{sched['tag']}"},
    ]
    assert chart["annotations"]["artifacthub.io/license"] == "Apache-2.0"
    assert all(link["url"].startswith("https://") for link in
               yaml.safe_load(chart["annotations"]["artifacthub.io/links"]))
    assert chart["home"].startswith("https://")
    assert chart["maintainers"] == [
        {"name": "gpu-share maintainers", "url": chart["home"]}
    ]
    # kubeVersion starts at the oldest minor the render tests check.
    assert chart["kubeVersion"] == f">={KUBE_MINORS[0]}.0-0"
