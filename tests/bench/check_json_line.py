#!/usr/bin/env python3
"""Runs a benchmark with tiny inputs and checks the interface of its output,
not its figures: exit status 0, and a last line that is one JSON object
holding every given key (a.b for a key of a nested object, a[] for a key of
every object of a list).

usage: check_json_line.py KEY[,KEY...] -- COMMAND ARGS...
"""
import json
import subprocess
import sys


def has(obj, path):
    head, _, rest = path.partition(".")
    if head.endswith("[]"):
        items = obj.get(head[:-2]) if isinstance(obj, dict) else None
        return (isinstance(items, list) and items and
                all(has(i, rest) for i in items))
    if not isinstance(obj, dict) or head not in obj:
        return False
    return has(obj[head], rest) if rest else True


def main():
    sep = sys.argv.index("--")
    keys = [k for k in sys.argv[1].split(",") if k]
    cmd = sys.argv[sep + 1:]
    run = subprocess.run(cmd, capture_output=True, text=True)
    name = cmd[0].rsplit("/", 1)[-1]
    if run.returncode != 0:
        print(run.stdout[-4000:], run.stderr[-4000:])
        print(f"{name}: exit status {run.returncode}")
        return 1
    lines = run.stdout.strip().splitlines()
    try:
        doc = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError) as e:
        print(run.stdout[-4000:])
        print(f"{name}: the last line is not a JSON object: {e}")
        return 1
    missing = [k for k in keys if not has(doc, k)]
    if missing:
        print(lines[-1])
        print(f"{name}: the JSON object lacks {', '.join(missing)}")
        return 1
    print(f"{name}: exit 0, JSON with {len(keys)} keys checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
