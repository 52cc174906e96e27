"""Trivial compiler equivalence (TCE) for the operator schema: which mutants compile to the right
patch's code, or to another mutant's (issue 26).

The schema holds every mutant in one TU behind `patchkit_mutant(K)`, read at run time, so the
build cannot tell mutants apart. Here the same TU is compiled ONCE more, by clang, to LLVM IR
before any optimisation, with the selector made a compile-time constant's load
(`-DPATCHKIT_TCE`: `patchkit_tce_id`, left undefined). Only the functions that hold a switch are
kept (llvm-extract); then, per mutant, the constant is defined as K and those functions are
optimised at -O2 (opt). Equal optimised IR means equal code: K == the right patch's (0) is
trivially equivalent; K == an earlier mutant is its duplicate. Both are dropped before the suite.

Sound, not complete: the functions are optimised without the rest of the TU (callees are only
declared), so inlining is weaker than the real build's and fewer mutants may compare equal, but
none compares equal that differs. The build's compiler (gcc) is not clang: TCE here is "equal
under clang -O2", said as such in the report. Needs clang++ and LLVM's opt/llvm-extract of the
same version (Debian: clang, llvm); without them the campaign says TCE was not measured.
"""
from __future__ import annotations

import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from . import cache, proc
from .codeindex import CompileCommand
from .errors import BuildError

DEFINE = "PATCHKIT_TCE"
CONSTANT = "patchkit_tce_id"


@dataclass(frozen=True)
class Tce:
    equivalent: dict[int, str]   # mutant id -> "the right patch" | "#J" (an earlier mutant's code)
    functions: tuple[str, ...]   # the functions compared (those that hold a switch)
    seconds: float
    compiler: str                # clang's version line
    cached: bool = False         # read back from the cache (measured once for this content: measure_cached)


def tools() -> tuple[Path, Path, Path] | None:
    """clang++, opt and llvm-extract of one LLVM version (the directory clang++ resolves into), or
    None when they are not installed."""
    for name in ("clang++", *(f"clang++-{v}" for v in range(20, 13, -1))):
        exe = shutil.which(name)
        if not exe:
            continue
        bin_dir = Path(exe).resolve().parent
        opt, extract = bin_dir / "opt", bin_dir / "llvm-extract"
        if opt.exists() and extract.exists():
            return Path(exe), opt, extract
    return None


def _ir_argv(clangxx: Path, cmd: CompileCommand, source: Path, out: Path) -> list[str]:
    """The TU's own flags (compile_commands.json), for clang, emitting IR that -O2 may optimise."""
    argv = list(cmd.argv[1:])
    keep: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or Path(a).name == cmd.file.name or a.startswith("-O"):
            continue
        keep.append(a)
    if not any(a.startswith("-std=") for a in keep):
        keep.append("-std=gnu++17")  # CMake leaves it out where gcc's default already satisfies the project
    return [str(clangxx), *keep, "-iquote", str(cmd.file.parent), f"-D{DEFINE}", "-O2", "-Xclang",
            "-disable-llvm-passes", "-S", "-emit-llvm", "-w", "-o", str(out), str(source)]


_DEFINE_RE = re.compile(r"^define [^\n]*?@(\"[^\"]+\"|[\w.$]+)\(", re.M)


def _holders(ir: str, switch: str) -> list[str]:
    """The functions whose body calls the switch (their names as the IR spells them)."""
    names = []
    starts = [(m.start(), m.group(1)) for m in _DEFINE_RE.finditer(ir)]
    for i, (at, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(ir)
        body = ir[at:end]
        if switch in name:
            names.append(name)
        elif re.search(rf"@\w*{switch}\w*\(", body):
            names.append(name)
    return names


def _normal(ir: str, switch: str) -> str:
    """The optimised module without what names the file it came from, and without the switch's own
    body (it names K; what matters is what its callers became)."""
    out, skip = [], False
    for line in ir.splitlines():
        if line.startswith("define ") and f"{switch}" in line.split("(")[0]:
            skip = True
        if not skip and not line.startswith(("; ModuleID", "source_filename")):
            out.append(line)
        if skip and line == "}":
            skip = False
    return "\n".join(out)


def measure(schema_text: str, cmd: CompileCommand, ids: list[int], work: Path, switch: str,
            progress=lambda s: None) -> Tce | None:
    """TCE of the mutants `ids` of a schema TU compiled with `cmd`'s flags. None: no clang here."""
    found = tools()
    if found is None:
        return None
    clangxx, opt, extract = found
    t0 = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    src = work / cmd.file.name
    src.write_text(schema_text)
    full = work / "schema.ll"
    progress(f"TCE: compiling the schema to LLVM IR with {clangxx.name}")
    proc.run(_ir_argv(clangxx, cmd, src, full), cwd=cmd.directory, timeout=900, error=BuildError,
             what="clang (the schema to LLVM IR, for TCE)")
    names = _holders(full.read_text(errors="replace"), switch)
    if not names:
        raise BuildError(f"TCE: no function of the schema's IR calls {switch}: the selector was inlined away "
                         "before -O2 (the IR was not emitted unoptimised)")
    small = work / "holders.ll"
    proc.run([str(extract), "-S", *(f"--func={n.strip(chr(34))}" for n in names), str(full), "-o", str(small)],
             timeout=600, error=BuildError, what="llvm-extract (TCE)")
    text = small.read_text()
    full.unlink()  # ~30 MB; holders.ll (the functions compared) stays beside the report
    src.unlink()
    decl = re.compile(rf"^@{CONSTANT} = external (?:dso_local )?(?:local_unnamed_addr )?constant i32.*$", re.M)
    if not decl.search(text):
        raise BuildError(f"TCE: the extracted functions do not read @{CONSTANT} (the schema's prelude under "
                         f"-D{DEFINE} changed?)")

    # every kept function stays, used or not: -O2 would delete an internal or linkonce function no
    # other kept function calls, and a deleted function compares equal whatever its mutant did.
    # llvm-extract already makes what it keeps external (hidden, measured with clang 14: the real
    # test's static function); this holds it so for a linkage another version may leave discardable
    text = re.sub(r"^define (?:internal|private|linkonce_odr|linkonce|weak_odr|available_externally) ", "define ",
                  text, flags=re.M)

    def optimised(k: int) -> str:
        path = work / f"m{k}.ll"
        path.write_text(decl.sub(f"@{CONSTANT} = internal constant i32 {k}, align 4", text, count=1))
        out = proc.run([str(opt), "-O2", "-S", str(path)], timeout=600, error=BuildError,
                       what=f"opt -O2 (TCE, mutant {k})").out
        path.unlink()
        return _normal(out, switch)

    progress(f"TCE: {len(ids) + 1} optimisations of {len(names)} function(s)")
    with ThreadPoolExecutor(max_workers=2) as pool:
        codes = list(pool.map(optimised, [0, *ids]))
    right, seen, equivalent = codes[0], {}, {}
    for k, code in zip(ids, codes[1:]):
        if code == right:
            equivalent[k] = "the right patch"
        elif code in seen:
            equivalent[k] = f"#{seen[code]}"
        else:
            seen[code] = k
    version = proc.run([str(clangxx), "--version"], check=False).out.splitlines()
    return Tce(equivalent, tuple(n.strip('"') for n in names), time.monotonic() - t0, version[0] if version else "")


def measure_cached(schema_text: str, cmd: CompileCommand, ids: list[int], work: Path, switch: str,
                   progress=lambda s: None) -> Tce | None:
    """`measure`, once per content: the schema's text, its flags and directory, the ids, the tools
    (path, size, mtime) and this file's own code. A campaign's shards, and its next run on this
    machine, read the result back instead of compiling the TU to IR again (8 s measured, the
    opt runs beside it); holders.ll (the functions compared) is written beside the report either way."""
    found = tools()
    if found is None:
        return None
    stamp = [(str(t), t.stat().st_size, t.stat().st_mtime_ns) for t in found]
    key = cache.digest(schema_text, cmd.argv, str(cmd.directory), sorted(ids), switch, stamp,
                       Path(__file__).read_bytes())

    def make() -> dict | None:
        got = measure(schema_text, cmd, ids, work, switch, progress)
        return None if got is None else {**asdict(got), "holders": (work / "holders.ll").read_text()}

    doc, back = cache.kept(f"tce-{key}", make)
    if doc is None:
        return None
    holders = doc.pop("holders")
    if back:
        work.mkdir(parents=True, exist_ok=True)
        (work / "holders.ll").write_text(holders)
        progress("TCE: read back (measured once for this schema, its flags and these tools)")
    return Tce({int(k): v for k, v in doc["equivalent"].items()}, tuple(doc["functions"]), doc["seconds"],
               doc["compiler"], cached=back)
