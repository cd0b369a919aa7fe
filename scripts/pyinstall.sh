#!/usr/bin/env bash
# pyinstall VENV PIP_INSTALL_ARGS...: `pip install -q PIP_INSTALL_ARGS` into the virtual
# environment VENV, through uv when there is one, else through VENV's own pip.
#
# Why uv: with pip, `make test`'s installs took ~7 of CI's ~26 minutes (.venv 118 s, then the side
# venvs 314 s side by side); uv downloads and installs in parallel (MLflow's server venv: 88 s with
# pip, 4-5 s with uv before compiling; docs/benchmarks.md, "make test's installs through uv").
# uv reads none of pip's configuration, so the machine's find-links, constraints and index
# (pip.conf or PIP_* variables: the find-links folder is where the CPU build of torch lies on our
# machines) are passed on; a local folder that does not exist is left out (pip only warns).
# pip's extra indexes are not: uv would prefer their files over the main index's for the same
# release (our machines' local index holds soundfile's pure-Python wheel, without the library
# that PyPI's manylinux wheel bundles; BFCL's venv then cannot import it).
# uv compiles the modules at install, as pip does. Should uv fail, the install is retried with
# pip, and the output says so.
#
# Which uv: $UV, else the project's .venv/bin/uv (the Makefile installs it there first), else
# `uv` on PATH; ENVACE_PIP_ONLY=1 uses pip alone.
#
# Usage: source scripts/pyinstall.sh; pyinstall .cache/some-venv "pkg==1.0"
#    or: bash scripts/pyinstall.sh .venv -e ".[test]"

_PYINSTALL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

_pyinstall_uv() {  # the uv to use, or nothing
    [[ "${ENVACE_PIP_ONLY:-0}" == 1 ]] && return 0
    local uv="${UV:-}"
    [[ -z "$uv" && -x "$_PYINSTALL_ROOT/.venv/bin/uv" ]] && uv="$_PYINSTALL_ROOT/.venv/bin/uv"
    [[ -z "$uv" ]] && uv="$(command -v uv || true)"
    [[ -n "$uv" && -x "$uv" ]] && echo "$uv"
    return 0
}

_pyinstall_pip_options() {  # pip's find-links, constraints and index as uv options, a line each
    local venv=$1 line key value item
    # `pip config list` prints every configured key, the PIP_* variables' as `:env:.key`
    while IFS= read -r line; do
        [[ "$line" =~ ^[^=]*\.(find-links|constraint|index-url)=\'(.*)\'$ ]] || continue
        key=${BASH_REMATCH[1]} value=${BASH_REMATCH[2]}
        [[ "$key" == index-url ]] && key=default-index
        for item in $value; do
            local path=${item#file://}
            if [[ "$item" == /* || "$item" == file://* ]] && [[ ! -e "$path" ]]; then
                continue  # a local folder this machine lacks
            fi
            echo "--$key"
            echo "$item"
        done
    done < <("$venv/bin/python" -m pip config list 2>/dev/null ||
        python3 -m pip config list 2>/dev/null)  # a venv without pip: the same files and variables
}

pyinstall() {
    local venv=$1
    shift
    if [[ ! -x "$venv/bin/python" ]]; then
        echo "pyinstall: $venv/bin/python not found: create the venv first" >&2
        return 2
    fi
    local uv
    uv="$(_pyinstall_uv)"
    if [[ -n "$uv" ]]; then
        local -a opts=()
        mapfile -t opts < <(_pyinstall_pip_options "$venv")
        # unsafe-best-match: the best version over the index and the find-links folders, as pip
        # picks (uv's default takes the first source holding a package, whatever its versions)
        # --compile-bytecode: pip compiles every module at install; uv would leave it to the
        # first import, and where PYTHONDONTWRITEBYTECODE is set (our machines) every process
        # then compiles torch's and transformers' modules again (the suite ran 1.6x slower)
        if "$uv" pip install --quiet --native-tls --index-strategy unsafe-best-match \
            --compile-bytecode --python "$venv/bin/python" "${opts[@]}" "$@"; then
            return 0
        fi
        echo "pyinstall: uv ($uv) failed to install $* into $venv (its error is above);" \
            "installing with pip instead" >&2
    fi
    "$venv/bin/python" -m pip install -q "$@"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    set -euo pipefail
    if (($# < 2)); then
        echo "usage: bash scripts/pyinstall.sh VENV PIP_INSTALL_ARGS..." >&2
        exit 2
    fi
    pyinstall "$@"
fi
