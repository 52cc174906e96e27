"""report.html as a reviewer sees it: rendered by headless Chromium (Debian's `chromium`, which
ci/run.sh installs), the timeline chart present, labelled and visible."""
import re
import shutil
import subprocess

import git
import pytest

from toolkit import report, verify, workload
from toolkit.ui import UI


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("the real tier needs headless Chromium (`apt-get install chromium`; ci/run.sh installs it)")
    return path


def test_report_html_renders_the_timeline(c2, c2_base, tmp_path):
    res = verify.verify(git.Repo(c2.path), base_ref="patchkit-baseline", workloads=[workload.load("overflow-4")],
                        out_dir=tmp_path, ui=UI(quiet=True))
    html = report.write(res, tmp_path)["html"]
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([chromium(), *flags, "--dump-dom", html.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    for text in ["server step (0 = the step where the pool ran out)", "KV cells held (prompt + tokens)",
                 "overflow-4: candidate run 1", "overflow-4: base run 1"]:
        assert text in dom, f"'{text}' not in the rendered page"
    assert re.search(r"overflow at off \d+: slot \d+ \(\d+ cells\) terminated", dom), "the eviction is marked"
    assert dom.count("<svg") >= 2, "a chart per side"
    png = tmp_path / "shot.png"
    subprocess.run([chromium(), *flags, "--window-size=1100,1400", f"--screenshot={png}", html.as_uri()],
                   capture_output=True, timeout=120)
    from PIL import Image
    img = Image.open(png).convert("L")
    lo, hi = img.getextrema()
    assert img.size == (1100, 1400) and hi - lo > 100, "the screenshot is blank"
    colours = len(Image.open(png).convert("RGB").getcolors(maxcolors=1 << 24))
    assert colours > 50, f"only {colours} colours: no chart drawn"
