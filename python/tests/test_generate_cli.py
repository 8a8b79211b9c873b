"""python -m kvtier.generate: the report of kvtier-run generate, the same keys; clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO, build_dir, program

PROMPT = "Name three colors."


def run(*args, check=True):
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{build_dir() / 'python'}:{REPO / 'python'}"
    return subprocess.run([sys.executable, "-m", "kvtier.generate", *args], env=env,
                          capture_output=True, text=True, check=check, timeout=600)


def test_json_report_has_kvtier_runs_keys(daemon):
    ours = json.loads(run("--prompt", PROMPT, "--chat", "--max-new-tokens", "12", "--json",
                          "--daemon", daemon.address).stdout)
    theirs = json.loads(subprocess.run(
        [program("kvtier-run"), "generate", "--prompt", PROMPT, "--chat", "--max-new-tokens", "12",
         "--hbm-ratio", "0.5", "--evict-ratio", "0.03", "--json", "--local"],
        capture_output=True, text=True, check=True, timeout=600).stdout)
    missing = set(theirs["report"]) - set(ours["report"])
    assert not missing, f"keys of kvtier-run's report missing here: {sorted(missing)}"
    assert set(ours) >= {"text", "tokens", "report"}
    r = ours["report"]
    assert r["daemon_backed"] and r["daemon"] == daemon.address
    assert r["generated_tokens"] == len(ours["tokens"]) > 0
    assert r["decode_tokens_per_second"] > 0


def test_text_report_and_progress():
    out = run("--prompt", PROMPT, "--max-new-tokens", "8", "--policy", "full")
    assert "── tier report: policy full" in out.stdout
    assert "tokens by tier" in out.stdout
    assert "generating" in out.stderr  # the progress bar


def test_bad_arguments_name_the_flag(tmp_path):
    bad = run("--prompt", "x", "--hbm-ratio", "1.5", check=False)
    assert bad.returncode == 2 and "--hbm-ratio" in bad.stderr and "1.5" in bad.stderr
    bad = run("--prompt", "x", "--daemon", "127.0.0.1:1", check=False)
    assert bad.returncode == 2 and "unix:PATH" in bad.stderr
    bad = run("--prompt", "x", "--model", str(tmp_path / "none.gguf"), check=False)
    assert bad.returncode == 2 and "none.gguf" in bad.stderr
    dead = run("--prompt", "x", "--daemon", f"unix:{tmp_path}/nobody.sock", check=False)
    assert dead.returncode == 1 and "nobody.sock" in dead.stderr, dead.stderr


def test_the_report_says_whether_beta_was_met_and_why():
    # The defaults protect the prompt and 128 recent positions: a short chain cannot meet β.
    out = run("--prompt", PROMPT, "--chat", "--max-new-tokens", "8", "--hbm-ratio", "0.3").stdout
    assert "β               NOT met" in out and "protected set" in out, out
    assert "--no-protect-prompt" in out, out
    # With the protected set small, pages leave T0 and the line says β was met.
    out = run("--prompt", PROMPT, "--chat", "--max-new-tokens", "40", "--hbm-ratio", "0.3",
              "--no-protect-prompt", "--window-tokens", "16", "--sink-tokens", "2",
              "--retier-interval", "8", "--page-tokens", "8").stdout
    assert "β               met" in out, out
    tiers = out.split("tokens by tier")[1].split()
    assert int(tiers[3]) > 0, out  # T1 holds tokens: pages left T0
