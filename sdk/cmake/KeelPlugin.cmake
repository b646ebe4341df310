# keel_add_plugin(<name> [OUTPUT_DIRECTORY <dir>] <sources>...)
#
# Builds <name>.so as a Keel plugin: hidden visibility, and a version script that exports
# only keel_plugin_entry, so plugins never clash with each other's or the host's symbols.
set(_KEEL_PLUGIN_MAP "${CMAKE_CURRENT_LIST_DIR}/keel_plugin.map" CACHE INTERNAL "")

function(keel_add_plugin name)
  cmake_parse_arguments(ARG "" "OUTPUT_DIRECTORY" "" ${ARGN})
  if(NOT ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "keel_add_plugin(${name}): no sources given")
  endif()
  add_library(${name} MODULE ${ARG_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE Keel::sdk)
  target_compile_features(${name} PRIVATE cxx_std_20)
  set_target_properties(${name} PROPERTIES
    PREFIX ""
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LINK_DEPENDS "${_KEEL_PLUGIN_MAP}")
  target_link_options(${name} PRIVATE "LINKER:--version-script=${_KEEL_PLUGIN_MAP}")
  if(ARG_OUTPUT_DIRECTORY)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${ARG_OUTPUT_DIRECTORY}")
  endif()
endfunction()
