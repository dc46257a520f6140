"""Compares the machine code (SASS) of every kernel variant between two source trees, with no GPU.

A refactoring of the CUDA sources that leaves a kernel's SASS unchanged cannot change its speed, so
only the variants this reports as changed need an A/B run on the device (bench/ab.py). Each tree is
compiled with its own cupyflash (NVRTC, the options the runtime uses) and disassembled with nvdisasm
(the nvidia-cuda-nvdisasm wheel of the test extras); instructions are compared after removing
addresses and renumbering branch labels.

    python tools/sass_diff.py dump TREE OUT.json [--only REGEX] [--jobs N]
    python tools/sass_diff.py compare OLD.json NEW.json [--rename OLD=NEW ...] [--show N]

``dump`` runs in a subprocess whose PYTHONPATH is TREE (a directory holding ``cupyflash/`` and
``kernels_cu/``), so an old checkout (``git worktree add`` or ``git archive``) and the working tree
compile with their own code. ``--rename`` maps variant keys of the old tree to the new one by prefix
(``tc_fwd=sm80_fwd``). ``compare`` exits with 1 when some variant's instructions differ.
"""

import argparse
import concurrent.futures
import difflib
import glob
import json
import os
import re
import site
import subprocess
import sys
import tempfile

_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"\.L_x_\d+")
#: A relative return names the kernel's mangled name, which a renamed kernel changes.
_SELF = re.compile(r"`\(_Z\w+\)")


def _nvdisasm():
    for root in site.getsitepackages() + [site.getusersitepackages()]:
        found = sorted(glob.glob(os.path.join(root, "nvidia", "**", "bin", "nvdisasm"), recursive=True))
        if found:
            return found[-1]
    raise SystemExit("sass_diff: nvdisasm not found (pip install nvidia-cuda-nvdisasm)")


def _functions(cubin):
    """{mangled name: normalized instruction lines} of a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([_nvdisasm(), "-c", f.name], check=True, capture_output=True, text=True).stdout
    functions = {}
    for chunk in re.split(r"\n\s*\.text\.", text)[1:]:
        name = chunk[: chunk.index(":")].strip()
        labels = {}
        lines = []
        for line in chunk.splitlines():
            match = _INSTRUCTION.search(line)
            stripped = line.strip()
            if match:
                body = match.group(1)
            elif re.fullmatch(r"\.L_x_\d+:", stripped):
                body = stripped
            else:
                continue
            body = _SELF.sub("`(self)", body)
            lines.append(_LABEL.sub(lambda m: labels.setdefault(m.group(0), f".L{len(labels)}"), body))
        functions[name] = lines
    return functions


def _compile_api():
    """(variants, compile_offline, builds_for) of the cupyflash on sys.path, old layout or new."""
    try:
        from cupyflash._cuda import families, kernels  # the layout of the redesign
    except ImportError:
        from cupyflash import _families as families  # v0.9
        from cupyflash import _kernels as kernels
    return families.VARIANTS, kernels.compile_offline, kernels.builds_for


def _dump(out_path, only, jobs):
    variants, compile_offline, builds_for = _compile_api()
    pattern = re.compile(only) if only else None
    jobs_list = [(v, arch) for v in variants for arch in (80, 90) if builds_for(v, arch)
                 and (pattern is None or pattern.search(v.key))]

    def one(job):
        variant, arch = job
        cubin, log, lowered = compile_offline([variant], arch)
        section = log.split(f"Compiling entry function '{lowered[variant]}'")[1]
        registers = int(re.search(r"Used (\d+) registers", section).group(1))
        spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", section))
        return f"{variant.key}@sm_{arch}", {"registers": registers, "spill_bytes": spills,
                                            "sass": _functions(cubin)[lowered[variant]]}

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        result = dict(pool.map(one, jobs_list))
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f)
    print(f"{len(result)} variant builds written to {out_path}")


def _compare(old_path, new_path, renames, show):
    with open(old_path, encoding="utf-8") as f:
        old = json.load(f)
    with open(new_path, encoding="utf-8") as f:
        new = json.load(f)

    def renamed(key):
        for before, after in renames:
            if key.startswith(before):
                return after + key[len(before):]
        return key

    old = {renamed(k): v for k, v in old.items()}
    for dump in (old, new):  # dumps written before _SELF existed
        for entry in dump.values():
            entry["sass"] = [_SELF.sub("`(self)", line) for line in entry["sass"]]
    same, changed = [], []
    for key in sorted(set(old) & set(new)):
        a, b = old[key], new[key]
        if a["sass"] == b["sass"]:
            same.append(key)
            continue
        diff = [d for d in difflib.unified_diff(a["sass"], b["sass"], lineterm="", n=0) if d[:1] in "+-"
                and d[:3] not in ("+++", "---")]
        changed.append((key, a, b, diff))
    print(f"identical: {len(same)}   changed: {len(changed)}   only old: {len(set(old) - set(new))}   "
          f"only new: {len(set(new) - set(old))}")
    for key in sorted(set(old) - set(new)):
        print(f"  only old: {key}")
    for key in sorted(set(new) - set(old)):
        print(f"  only new: {key}")
    for key, a, b, diff in changed:
        print(f"  changed: {key}: {len(a['sass'])} -> {len(b['sass'])} instructions, registers {a['registers']} -> "
              f"{b['registers']}, spills {a['spill_bytes']} -> {b['spill_bytes']}, {len(diff)} lines differ")
        for line in diff[:show]:
            print(f"      {line}")
    return 1 if changed else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    dump = sub.add_parser("dump", help="compile and disassemble every variant of TREE")
    dump.add_argument("tree")
    dump.add_argument("out")
    dump.add_argument("--only", help="regular expression on variant keys")
    dump.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    inner = sub.add_parser("_dump")
    inner.add_argument("out")
    inner.add_argument("--only")
    inner.add_argument("--jobs", type=int)
    compare = sub.add_parser("compare", help="compare two dumps")
    compare.add_argument("old")
    compare.add_argument("new")
    compare.add_argument("--rename", action="append", default=[], help="OLD_PREFIX=NEW_PREFIX of variant keys")
    compare.add_argument("--show", type=int, default=0, help="differing lines to print per variant")
    args = parser.parse_args(argv)
    if args.command == "dump":
        env = dict(os.environ, PYTHONPATH=os.path.abspath(args.tree))
        command = [sys.executable, os.path.abspath(__file__), "_dump", os.path.abspath(args.out), "--jobs", str(args.jobs)]
        if args.only:
            command += ["--only", args.only]
        return subprocess.run(command, env=env, cwd=args.tree, check=False).returncode
    if args.command == "_dump":
        _dump(args.out, args.only, args.jobs)
        return 0
    return _compare(args.old, args.new, [tuple(r.split("=", 1)) for r in args.rename], args.show)


if __name__ == "__main__":
    sys.exit(main())
