#!/usr/bin/env bash
# Run the tests on the lowest versions pyproject.toml allows: each `>=X` (and `==X`) of the project's dependencies is
# installed as `==X` in a new virtual environment, and the tests run there. A lower bound the code does not really
# run on fails here, where a new user's install (the newest of everything, as .ci/run has it) would never see it.
#
#   bash scripts/check_deps.sh          the runtime dependencies, the plot and hub extras, pytest and hypothesis at
#                                       their lowest; the fast tier
#   bash scripts/check_deps.sh --all    every dependency of the dev extra at its lowest too; the whole suite
#
# Extra arguments go to pytest (`bash scripts/check_deps.sh -k strict`). torch is the exception: these machines
# install only the pinned CPU build, torch==2.13.0 (any other request pulls a multi-GB CUDA build), so `--all` uses it
# and the `torch>=` bound is checked by reading which torch APIs lmcalc calls (docs/development.md).
# The environment is .venv-lowest in the checkout (LMCALC_LOWEST_VENV to put it elsewhere), made anew each run.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=fast
if [[ "${1:-}" == "--all" ]]; then mode=all; shift; fi
venv="${LMCALC_LOWEST_VENV:-.venv-lowest}"

pins=$(python3 - "$mode" <<'EOF'
import re
import sys
import tomllib

with open("pyproject.toml", "rb") as file:
    pyproject = tomllib.load(file)
project = pyproject["project"]
requirements = [*project["dependencies"], *pyproject["build-system"]["requires"]]
dev = project["optional-dependencies"]["dev"]
requirements += dev if sys.argv[1] == "all" else [r for r in dev if re.match(r"(pytest|hypothesis)\b", r)]
if sys.argv[1] == "fast":  # with --all, transformers decides huggingface_hub, and dev names matplotlib itself
    requirements += [*project["optional-dependencies"]["plot"], *project["optional-dependencies"]["hub"]]
for requirement in requirements:
    name, rest = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*(.*)", requirement).groups()
    lowest = re.search(r"(?:>=|==)\s*([^,;\s]+)", rest)
    if name == "torch":
        print("torch==2.13.0")  # the one build these machines install (see above)
    elif lowest is None:
        sys.exit(f"check_deps: {requirement!r} in pyproject.toml has no lower bound")
    else:
        print(f"{name}=={lowest.group(1)}")
EOF
)

rm -rf "$venv"
python3 -m venv "$venv"
. "$venv/bin/activate"
echo "check_deps: installing the lowest versions allowed:" $pins
if grep -q '^torch==' <<<"$pins"; then pip install -q torch==2.13.0; fi
# shellcheck disable=SC2086  # one requirement a word
pip install -q $pins
pip install -q --no-deps --no-build-isolation -e .  # hatchling at its lowest builds it too
# An extra that cannot be imported would only skip its tests here: refuse it instead.
python -c "import lmcalc.cli, matplotlib.pyplot, huggingface_hub" || { echo "check_deps: an extra does not import"; exit 1; }
pip list --format=freeze | grep -iE '^(typer|rich|pydantic|pydantic[-_]core|pyyaml|pytest|hypothesis|torch|transformers|peft|bitsandbytes|matplotlib|hatchling|ruff|mypy|numpy)=='

if [[ "$mode" == fast ]]; then
    python -m pytest -m fast "$@"
else
    python -m pytest "$@"
fi
