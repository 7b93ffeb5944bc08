# SPDX-License-Identifier: Apache-2.0
# Writes OUT, `#define COMMDBG_REVISION "..."`: the source tree's git revision
# (`git describe --always --dirty`), or $COMMDBG_REVISION where set (a
# package built from a tarball), else "unknown".  Run at every build; the
# file is rewritten only when the revision changed, so only the programs'
# main files recompile.
if(DEFINED ENV{COMMDBG_REVISION} AND NOT "$ENV{COMMDBG_REVISION}" STREQUAL "")
  set(rev "$ENV{COMMDBG_REVISION}")
else()
  execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=12
                  OUTPUT_VARIABLE rev ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR rev STREQUAL "")
    set(rev "unknown")
  endif()
endif()
set(content "#define COMMDBG_REVISION \"${rev}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
else()
  set(old "")
endif()
if(NOT old STREQUAL content)
  file(WRITE "${OUT}" "${content}")
endif()
