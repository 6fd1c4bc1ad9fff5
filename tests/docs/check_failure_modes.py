#!/usr/bin/env python3
"""docs/FAILURE-MODES.md names the tests that show each failure mode: every
section must name at least one, and every name must be a test that ctest
lists (a parameterised test matches with its prefix and suffix, `Suite.*`
matches any test of the suite). Builds without gpu/ (the sanitizer builds)
list no tests of the CUDA suites; pass --no-gpu there to skip those names.

usage: check_failure_modes.py DOC CTEST BUILD_DIR [--no-gpu]
"""
import re
import subprocess
import sys

NAME = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*\.(?:\*|[A-Za-z_][A-Za-z0-9_]*))`")
PLACEHOLDER = "Suite.Test"  # the page's own example of the form
GPU_SUITES = ("Cuda", "Nccl")  # suites of tests/gpu/


def sections(text):
    """(title, body) of each numbered '## N.' section."""
    parts = re.split(r"^## (\d+\..*)$", text, flags=re.M)
    return list(zip(parts[1::2], parts[2::2]))


def listed(ctest, build_dir):
    out = subprocess.run([ctest, "--test-dir", build_dir, "-N"], check=True,
                         capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        m = re.match(r"\s*Test\s+#\d+: (\S+)", line)
        if m:
            names.add(m.group(1))
    return names


def exists(name, tests):
    suite, test = name.split(".", 1)
    for t in tests:
        # Prefix/Suite.Test/Param of TEST_P, or Suite.Test itself.
        core = t.split("/")[1] if t.count("/") >= 2 else t.split("/")[0]
        s, _, rest = core.partition(".")
        if s == suite and (test == "*" or rest == test):
            return True
    return False


def main():
    doc, ctest, build_dir = sys.argv[1:4]
    no_gpu = "--no-gpu" in sys.argv[4:]
    text = open(doc, encoding="utf-8").read()
    tests = listed(ctest, build_dir)
    problems = []
    secs = sections(text)
    if not secs:
        problems.append(f"{doc}: no numbered sections")
    for title, body in secs:
        names = [n for n in NAME.findall(body) if n != PLACEHOLDER]
        if not names:
            problems.append(f"{doc}: section '{title}' names no test")
        for n in names:
            if no_gpu and n.startswith(GPU_SUITES):
                continue
            if not exists(n, tests):
                problems.append(
                    f"{doc}: section '{title}' names '{n}', which ctest does "
                    f"not list")
    for p in problems:
        print(p)
    print(f"{len(secs)} sections, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
