"""Renders or lints the Helm chart with Helm's own library (PyPI helm-python-sdk: libhelm_c,
no helm binary, no cluster). Run by xtask (src/chart.rs) with setup's venv Python.

usage: chart.py render|lint CHART_DIR [VALUES_FILE]
       chart.py split STREAM_FILE OUT_DIR
render prints every rendered object as one YAML stream in Helm's install order; split writes
each object of a stream as OUT_DIR/NN-Kind-name.json, for the schema checkers."""

import json
import os
import sys

import helm_python as helm
import yaml

# Helm's install order for the kinds the chart renders (templates named after their kind).
ORDER = ["namespace", "serviceaccount", "rbac", "dashboard", "daemonset", "podmonitor",
         "prometheusrule"]


def split(stream_file, out_dir):
    with open(stream_file, encoding="utf-8") as f:
        objects = [o for o in yaml.safe_load_all(f) if o]
    os.makedirs(out_dir, exist_ok=True)
    for i, o in enumerate(objects):
        name = f"{i:02}-{o['kind']}-{o['metadata']['name']}.json"
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            json.dump(o, f, indent=1)


def main():
    command, chart_dir = sys.argv[1], sys.argv[2]
    if command == "split":
        split(chart_dir, sys.argv[3])
        return
    values = {}
    if len(sys.argv) > 3:
        with open(sys.argv[3], encoding="utf-8") as f:
            values = helm.values_from_yaml(f.read()) or {}
    if command == "lint":
        report = helm.lint(chart_dir, values, strict=True, kube_version="v1.30.0")
        problems = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
        for m in report.get("messages", []):
            print(f"{m.get('severity')}: {m.get('path')}: {m.get('error')}", file=sys.stderr)
        for e in report.get("errors") or []:
            print(f"error: {e}", file=sys.stderr)
        sys.exit(1 if problems or report.get("errors") else 0)
    chart = helm.Chart.load(chart_dir)
    chart.validate_schema(values)
    rendered = chart.render(values, name="clb-probe", namespace="clb-probe", is_install=True)
    def rank(path):
        stem = path.rsplit("/", 1)[-1].split(".")[0]
        return (ORDER.index(stem) if stem in ORDER else len(ORDER), path)
    out = []
    for path in sorted(rendered, key=rank):
        text = rendered[path].strip()
        if not path.endswith((".yaml", ".yml")) or not text:
            continue
        # Helm's own `---` separators inside one template stay as they are.
        out.append(f"---\n# Source: {path}\n{text.removeprefix('---').lstrip()}\n")
    sys.stdout.write("".join(out))


if __name__ == "__main__":
    try:
        main()
    except helm.HelmError as e:
        print(f"helm: {e}", file=sys.stderr)
        sys.exit(1)
