"""Guess an upstream source for each NL2RepoBench task: the PyPI sdist that holds its hidden tests.

    python scripts/nl2repo_sources.py BENCH_DIR [--out sources.toml] [--before 2025-09-01] [--cache DIR]

NL2RepoBench's public folders name the hidden test paths but not the project's version (3 of 104 specs pin it). For
each task this tries the PyPI distributions its name suggests (`CANDIDATES`, else the folder name), takes releases
uploaded before ``--before`` (the benchmark's images were built mid-2025), newest first, downloads each sdist (cached)
and keeps the first whose files include every path ``test_files.json`` lists. Prints what it chose and why not, and
writes ``task = "pypi:NAME==VERSION"`` lines for `gyre tasks import-nl2repobench --sources`. A guess: the import and
`gyre eval --agent oracle` then say whether the reference scores 1.0. Uses the network (the package registry) only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import urllib.parse
import urllib.request
import zipfile
from datetime import datetime
from pathlib import Path

# folder name -> PyPI names to try (the folder is the GitHub repository's name, not always the distribution's)
CANDIDATES = {
    "jinja": ["Jinja2"],
    "more-Itertools": ["more-itertools"],
    "pdfplumber-stable": ["pdfplumber"],
    "schedule-master": ["schedule"],
    "python-pytest-cases": ["pytest-cases"],
    "pysondb-v2": ["pysondb"],
    "python-slugify": ["python-slugify"],
    "python-dotenv": ["python-dotenv"],
    "python-jose": ["python-jose"],
    "python-fsutil": ["python-fsutil"],
    "python-pathspec": ["pathspec"],
    "pythonprojecttemplate": [],
    "pytorch-grad-cam": ["grad-cam"],
    "google-images-download": ["google_images_download"],
    "boto": ["boto"],
    "cherry": ["cherry"],
    "flasky": [],
    "graphneuralnetwork": [],
    "synthetic": [],
    "trimming": [],
    "verifiers": ["verifiers"],
    "uiautomator": ["uiautomator"],
    "coverage_shield": [],
    "autorccar": [],
    "dictdatabase": ["dictdatabase"],
    "fuzzywuzzy": ["fuzzywuzzy", "thefuzz"],
    "markdownify": ["markdownify"],
    "math-verify": ["math-verify"],
    "mootdx": ["mootdx"],
    "pdfplumber": ["pdfplumber"],
    "pyjwt": ["PyJWT"],
    "deslib": ["DESlib"],
    "dbutils": ["DBUtils"],
    "decouple": ["python-decouple"],
    "records": ["records"],
    "requests-html": ["requests-html"],
    "rich-click": ["rich-click"],
    "unittest-parametrize": ["unittest-parametrize"],
    "ydata-profiling": ["ydata-profiling"],
    "arxiv-mcp-server": ["arxiv-mcp-server"],
    "stable-baselines3": ["stable-baselines3"],
    "typing_extensions": ["typing_extensions"],
    "sklearn": ["scikit-learn"],
}


def releases(name: str, before: datetime) -> list[tuple[str, str]]:
    """(version, sdist URL) of ``name``'s releases with an sdist uploaded before ``before``, newest first."""
    api = f"https://pypi.org/pypi/{name}/json"
    try:
        with urllib.request.urlopen(api, timeout=60) as resp:
            data = json.load(resp)
    except OSError:
        return []
    found = []
    for version, files in data.get("releases", {}).items():
        for f in files:
            if f.get("packagetype") == "sdist" and not f.get("yanked"):
                uploaded = datetime.fromisoformat(f["upload_time_iso_8601"].replace("Z", "+00:00")).replace(
                    tzinfo=None
                )
                if uploaded < before:
                    found.append(
                        (uploaded, version, urllib.parse.urljoin(api, f["url"]))
                    )  # a mirror: relative
    return [(v, u) for _, v, u in sorted(found, reverse=True)]


def sdist_files(url: str, cache: Path) -> list[str]:
    """The file paths inside the sdist at ``url`` (its top directory stripped), downloading it once."""
    path = cache / url.rsplit("/", 1)[-1]
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["curl", "-sSfL", "-o", str(path), url], check=False, timeout=300)
        if done.returncode != 0:
            path.unlink(missing_ok=True)
            return []
    try:
        if path.suffix == ".zip":
            names = zipfile.ZipFile(path).namelist()
        else:
            with tarfile.open(path) as tar:
                names = [m.name for m in tar.getmembers() if m.isfile()]
    except (tarfile.TarError, zipfile.BadZipFile, OSError):
        return []
    return [n.split("/", 1)[1] for n in names if "/" in n]


def choose(task: Path, before: datetime, cache: Path, tries: int) -> tuple[str | None, str]:
    """(``pypi:NAME==VERSION`` or None, what was tried)."""
    wanted = [p.strip("/") for p in json.loads((task / "test_files.json").read_text())]
    names = CANDIDATES.get(task.name, [task.name])
    if not names:
        return None, "no PyPI distribution (not a published package)"
    tried = []
    for name in names:
        for version, url in releases(name, before)[:tries]:
            files = sdist_files(url, cache)
            if all(any(f == w or f.startswith(w + "/") for f in files) for w in wanted):
                return f"pypi:{name}=={version}", f"{name} {version}: holds {', '.join(wanted)}"
            tried.append(f"{name} {version}")
    if not tried:
        return None, f"no sdist before {before:%Y-%m-%d} for {', '.join(names)}"
    return None, f"no sdist holds {', '.join(wanted)} (tried {', '.join(tried)})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("bench", type=Path)
    parser.add_argument("--out", type=Path, default=Path("sources.toml"))
    parser.add_argument(
        "--before", default="2025-09-01", help="releases uploaded before this date (YYYY-MM-DD)"
    )
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "gyre" / "sdists")
    parser.add_argument("--tries", type=int, default=3, help="releases tried per distribution, newest first")
    args = parser.parse_args()
    root = args.bench / "test_files" if (args.bench / "test_files").is_dir() else args.bench
    before = datetime.fromisoformat(args.before)
    lines, found = [], 0
    tasks = sorted(p for p in root.iterdir() if (p / "test_files.json").is_file())
    for task in tasks:
        source, why = choose(task, before, args.cache, args.tries)
        print(f"{task.name}: {source or 'none'} ({why})", flush=True)
        if source:
            found += 1
            lines.append(f'"{task.name}" = "{source}"')
    args.out.write_text("\n".join(lines) + "\n")
    print(
        f"{found} of {len(tasks)} tasks have an sdist holding their hidden tests; wrote {args.out}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
