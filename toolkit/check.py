"""`patchkit check`: compile only the patched translation unit, plus presence checks of the patch;
`--property` adds the behavioural check of its batch surgery.

The compile uses the TU's own compile_commands.json command line (output to a temp file),
in seconds instead of a build. A warning is "new" when it points into a line the patch added
(a line diff of the file against the commit the series was applied on), so one compile is
enough: no baseline compile to diff.

`static_checks` are PRESENCE checks, not proofs: libclang finds the helper and counts the
calls to it (AST), then looks for the code that implements each invariant of docs/DESIGN.md,
section 2 in the helper's and the surgery's tokens (the rendered template's own statements:
the batch shrunk, embd copied and resized with it, the token pointer restored before
render(), the index shift). They catch a rendering that lost a piece, in seconds; code that
is present but wrong passes them. What the code DOES is checked by `property_check` (the
surgery run over random batches, each invariant asserted) and by the workloads (`verify`:
integrity, one-sample-per-entry, victim-is-largest on real runs).
"""
from __future__ import annotations

import re
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import git

from . import build as build_mod
from . import anchors, codeindex, patch, proc
from .compare import Check
from .errors import PatchError
from .source import resolve
from .ui import heartbeat, log_progress

DIAG = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+):(?P<col>\d+): (?P<sev>warning|error|fatal error): (?P<msg>.*)$")


@dataclass(frozen=True)
class CheckResult:
    commit: str
    file: str
    errors: tuple[str, ...]
    new_warnings: tuple[str, ...]
    old_warnings: int
    static: tuple[Check, ...]
    compile_s: float
    parse_s: float

    @property
    def ok(self) -> bool:
        return not self.errors and not self.new_warnings and all(c.ok for c in self.static)


def added_lines(before: str, after: str) -> set[int]:
    """1-based numbers of the lines of `after` that `before` does not have (the patch's lines)."""
    import difflib

    sm = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False)
    return {n + 1 for tag, _, _, j1, j2 in sm.get_opcodes() if tag in ("insert", "replace") for n in range(j1, j2)}


def compile_tu(cmd: codeindex.CompileCommand, ws_root: Path) -> proc.Result:
    """The TU compiled as CMake compiles it, through ccache as the build is (when installed): a hit
    replays the compiler's own stdout and stderr (every warning, as the first compile wrote it),
    and a failed compile is never cached. Measured: a warm test run compiled the same dozen
    patched TUs afresh each time, 25-45 s each (2026-12-03)."""
    argv = build_mod.compiler_argv(cmd.argv)
    with tempfile.TemporaryDirectory(prefix="patchkit-check-") as tmp:
        if "-o" in argv:
            argv[argv.index("-o") + 1] = str(Path(tmp) / "tu.o")
        return proc.run(argv, cwd=cmd.directory, timeout=900, check=False, env=build_mod._env(ws_root))


def static_checks(tu, facts_like: dict, helper_name: str = patch.HELPER) -> list[Check]:
    """Presence of the patched helper and of the code implementing each invariant (module doc):
    `hook-called` counts call expressions in the AST; the others look for the statements in the
    helper's and surgery's tokens. A pass says the code is there, not that it is right."""
    from clang.cindex import CursorKind as K

    _, methods = anchors.declarations(tu)
    main = str(tu.spelling)
    source = Path(main).read_bytes()
    helper, hook_calls = None, 0
    surgery_toks = ""
    for c in tu.cursor.get_children():  # a free function on plain-llama_batch layouts
        if c.spelling == patch.SURGERY and c.is_definition() and c.location.file and str(c.location.file) == main:
            surgery_toks = "".join(t.spelling for t in c.get_tokens())
    for _, m in methods:
        if m.spelling == patch.SURGERY:    # a server_batch member
            surgery_toks = "".join(t.spelling for t in m.get_tokens())
        elif m.spelling == helper_name:
            helper = m
        elif helper_name.encode() in source[m.extent.start.offset:m.extent.end.offset]:
            hook_calls += sum(1 for c in m.walk_preorder() if c.kind == K.CALL_EXPR and c.spelling == helper_name)
    if helper is None:
        return [Check("helper-present", "fail", f"{helper_name}() not found in the patched TU")]
    toks = "".join(t.spelling for t in helper.get_tokens()) + surgery_toks
    checks = [Check("hook-called", "pass" if hook_calls == 1 else "fail",
                    f"{helper_name}() called {hook_calls} time(s) from the decode handler (AST)")]
    removes_tokens = "tokens.resize(" in toks or "n_tokens=n_new" in toks
    checks.append(Check("removes-entries", "pass" if removes_tokens else "fail",
                        "present: the batch is shrunk (tokens.resize / n_tokens = n_new)" if removes_tokens
                        else "absent: the helper never shrinks the batch"))
    if facts_like.get("has_embd"):
        ok = "embd.resize(" in toks and "std::copy(" in toks
        checks.append(Check("embd-compacted", "pass" if ok else "fail",
                            "present: embd rows copied (std::copy) and embd resized with the tokens; "
                            "alignment itself: --property" if ok
                            else "absent: tokens shrink but embd is neither copied nor resized: embeddings misalign"))
    if facts_like.get("has_tokens_ptr"):
        restore = toks.find("tokens_ptr")
        render = toks.find(".render()")
        ok = render < 0 or (0 <= restore < render)
        checks.append(Check("token-pointer-restored", "pass" if ok else "fail",
                            "present: tokens_ptr assigned before the first render()" if ok
                            else "absent: render() comes before any tokens_ptr assignment (embd mode's null "
                                 "token pointer)"))
    remapped = "indices.push_back(&s->i_batch)" in toks and "*idx-=n_removed[*idx]" in toks
    checks.append(Check("indices-remapped", "pass" if remapped else "fail",
                        "present: survivors' i_batch collected and shifted by the removed entries before them; "
                        "the shift's correctness: --property" if remapped
                        else "absent: survivors' i_batch are not shifted: they would sample stale indices"))
    if facts_like.get("has_spec_i_batch"):
        ok = "spec_i_batch)" in toks and "indices.push_back(&idx)" in toks and remapped
        checks.append(Check("spec-indices-remapped", "pass" if ok else "fail",
                            "present: spec_i_batch entries collected for the same shift" if ok
                            else "absent: spec_i_batch not collected for the shift"))
    return checks


def check(repo: git.Repo, ref: str | None = None, patch_name: str = patch.DEFAULT_PATCH,
          opts: build_mod.Options = build_mod.Options(), progress=log_progress, compile: bool = True) -> CheckResult:
    """`compile=False`: the libclang checks only (the mutation campaign builds the TU anyway)."""
    commit = resolve(repo, ref)
    with build_mod.held(repo, commit, opts, progress) as ws:  # nobody switches the tree while we read it
        return _check(repo, commit, ws, patch.load_patch(patch_name), progress, compile)


def _check(repo: git.Repo, commit: str, ws, spec, progress, compile: bool) -> CheckResult:
    rel = anchors.find_server_file(ws.src)
    path = ws.src / rel
    text = path.read_text(errors="replace")
    if patch.state(text, spec) != "applied":
        raise PatchError(f"{rel} at {commit[:12]} does not carry '{spec.name}'; apply it first "
                         "(`patchkit apply`) or pass --ref of the patched branch.")
    cmd = ws.compile_command(rel)
    from .apply import series_base
    under = series_base(repo, commit, within=50)
    added = added_lines(repo.git.show(f"{under}:{rel}") if under else "", text) if under else set()

    # libclang parse (static checks) runs while the compiler works
    box: dict = {}

    def parse() -> None:
        t = time.monotonic()
        try:
            tu = codeindex.parse(cmd)
            structs, _ = anchors.declarations(tu)
            batch, slot = structs.get("server_batch", {}), structs.get("server_slot", {})
            facts = {"has_embd": "has_embd" in batch and "embd" in batch, "has_tokens_ptr": "tokens_ptr" in batch,
                     "has_spec_i_batch": "spec_i_batch" in slot}
            box["static"] = static_checks(tu, facts, spec.helper)
        except Exception as e:  # reported as a failed check, never lost
            box["static"] = [Check("libclang-parse", "fail", f"{type(e).__name__}: {e}")]
        box["parse_s"] = time.monotonic() - t

    if not compile:
        parse()
        return CheckResult(commit, rel, (), (), 0, tuple(box.get("static", [])), 0.0, box.get("parse_s", 0.0))
    th = threading.Thread(target=parse)
    th.start()
    progress(f"compiling {rel} with its compile_commands.json command")
    with heartbeat(progress, lambda: f"compiling {rel}"):
        res = compile_tu(cmd, ws.root)
    th.join()
    errors, new, old = [], [], 0
    for line in (res.err + res.out).splitlines():
        m = DIAG.match(line)
        if not m:
            continue
        in_file = Path(m["file"]).name == path.name
        inside = in_file and int(m["line"]) in added
        if m["sev"] != "warning":
            errors.append(line.strip())
        elif inside:
            new.append(line.strip())
        else:
            old += 1
    if res.rc != 0 and not errors:
        errors.append(f"compiler exit code {res.rc}: " + build_mod.first_error(res.err + res.out))
    return CheckResult(commit, rel, tuple(errors), tuple(new), old, tuple(box.get("static", [])),
                       res.seconds, box.get("parse_s", 0.0))


@dataclass(frozen=True)
class PropertyResult:
    commit: str
    ok: bool
    iterations: int
    output: str
    compile_s: float
    run_s: float


def property_check(repo: git.Repo, ref: str | None = None, iterations: int = 20000,
                   opts: build_mod.Options = build_mod.Options(), progress=log_progress,
                   sanitize: bool = False) -> PropertyResult:
    """Compile the patched TU's prefix (through the batch-surgery function) plus a random-batch
    driver with the TU's own flags, link it against the tree's own static libraries, run it."""
    spec = patch.load_patch()
    commit = resolve(repo, ref)
    build_mod.build(repo, commit, opts, progress, in_workspace=True)  # the tree's static libraries
    with build_mod.held(repo, commit, opts, progress) as ws:
        return _property(repo, commit, ws, spec, iterations, progress, sanitize)


def _property(repo: git.Repo, commit: str, ws, spec, iterations: int, progress, sanitize: bool = False) -> PropertyResult:
    """`sanitize`: the harness with ASan + UBSan (the tree's libraries stay plain; ASan's allocator
    still bounds every heap block), so an out-of-bounds read the surgery's result hides is caught."""
    rel = anchors.find_server_file(ws.src)
    text = (ws.src / rel).read_text(errors="replace")
    if patch.state(text, spec) != "applied":
        raise PatchError(f"{rel} at {commit[:12]} does not carry '{spec.name}'.")
    batch_struct = re.search(r"struct server_batch \{.*?\n\};\n", text, re.S)
    if not batch_struct or f"void {patch.SURGERY}(int32_t id_slot" not in batch_struct.group(0):
        raise PatchError(f"{rel}: the property check drives server_batch layouts (C, C2, D); this tree's batch "
                         "is a plain llama_batch (layouts A, B), covered by `check` and the workloads instead.")
    end = batch_struct.end()
    has_embd = bool(batch_struct and re.search(r"\bbool has_embd\b", batch_struct.group(0)))
    facts = {"has_embd": has_embd}
    driver = patch.templates(spec).get_template("property.cpp.j2").render(
        f=type("F", (), facts), surgery=patch.SURGERY)
    out_dir = ws.root / "property"
    out_dir.mkdir(exist_ok=True)
    src = out_dir / "harness.cpp"
    src.write_text(text[:end] + driver)
    cmd = ws.compile_command(rel)
    san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"] if sanitize else []
    # compiled with the TU's own command (through ccache, like compile_tu: the same harness text is a
    # hit on the next run), then linked against the tree's static libraries
    argv = [a for a in cmd.argv if Path(a).name != "ccache"]
    compiler = argv[0]
    obj = out_dir / "harness.o"
    argv[argv.index("-o") + 1] = str(obj)
    argv = build_mod.compiler_argv([str(src) if Path(a).name == Path(rel).name else a for a in argv] + san)
    libs = sorted(str(p) for p in ws.build.rglob("lib*.a"))
    link = [compiler, str(obj), "-o", str(out_dir / "harness"),
            "-Wl,--start-group", *libs, "-Wl,--end-group", "-fopenmp", "-lpthread", "-ldl", "-lm", *san]
    progress(f"compiling the property harness ({len(libs)} static libraries)")
    with heartbeat(progress, lambda: "compiling the property harness"):
        res = proc.run(argv, cwd=cmd.directory, timeout=900, check=False, env=build_mod._env(ws.root))
        if res.rc == 0:
            linked = proc.run(link, cwd=cmd.directory, timeout=900, check=False)
            res = replace(linked, seconds=res.seconds + linked.seconds)
    if res.rc != 0:
        raise PatchError("the property harness did not compile: " + build_mod.first_error(res.err + res.out))
    progress(f"running {iterations} random batches")
    return run_harness(out_dir / "harness", commit, iterations, compile_s=res.seconds)


def run_harness(harness: Path, commit: str, iterations: int, env: dict[str, str] | None = None,
                compile_s: float = 0.0) -> PropertyResult:
    """One run of a compiled harness (`env`: e.g. the operator schema's mutant id)."""
    import os
    run = proc.run([str(harness), str(iterations)], timeout=600, check=False,
                   env=dict(os.environ, **env) if env else None)
    return PropertyResult(commit, run.rc == 0 and run.out.startswith("ok"), iterations,
                          (run.out + run.err).strip(), compile_s, run.seconds)
