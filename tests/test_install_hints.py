"""Missing-extra hints work for a wheel as for a checkout (issue 35): shoal is not on a package
index, so ``pip install 'shoal[dashboard]'`` failed for anyone who had installed the wheel.  The
hint names the packages themselves first."""

from __future__ import annotations

from conftest import run_script


def test_the_dashboard_hint_names_the_packages_and_both_extra_forms():
    out = run_script("import sys\nsys.modules['uvicorn'] = None\n"
                     "from shoal.dashboard import Dashboard\n"
                     "try:\n    Dashboard()\nexcept ImportError as exc:\n    print(exc)\n")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "pip install starlette uvicorn tqdm" in text, text
    assert "pip install -e '.[dashboard]'" in text and ".whl[dashboard]" in text, text
    assert "pip install 'shoal[dashboard]'" not in text
