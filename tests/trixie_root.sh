#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The trixie root of the torch 2.x tests: tests/debian_root.sh trixie (see there).
#   tests/trixie_root.sh [--check] [DIR]
check=()
if [[ ${1:-} == --check ]]; then check=(--check); shift; fi
exec "$(dirname "$0")/debian_root.sh" "${check[@]}" trixie "$@"
