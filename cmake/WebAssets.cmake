# The web dashboard (web/, served by varuna-manager at /): built with npm + esbuild at build
# time and embedded into a static library as byte arrays (manager/api/web_assets.h).
#
# varuna_web_assets([TARGET])   (TARGET defaults to varuna_web_assets)
#   1. copies web/package.json + web/package-lock.json into ${CMAKE_BINARY_DIR}/web and runs
#      `npm ci` there (the source tree gets no node_modules; reruns only when they change);
#   2. runs `node web/build.mjs ${CMAKE_BINARY_DIR}/web/dist --node_modules ...`, which writes
#      index.html, app.js and app.css (uPlot and its CSS bundled in: no CDN at run time);
#   3. turns the three files into ${CMAKE_BINARY_DIR}/web/web_assets.cc (cmake/embed_assets.cmake);
#   4. adds the static library TARGET from it (FindWebAsset, include dir the project root).
#
# VARUNA_WEB=OFF (or -DVARUNA_WEB=OFF when node/npm are not installed) embeds a one-line
# placeholder page instead; ON without node and npm is a configure error.
option(VARUNA_WEB "Build the web dashboard with npm + esbuild (OFF: embed a placeholder page)" ON)

set(_VARUNA_WEB_ASSETS_DIR "${CMAKE_CURRENT_LIST_DIR}")

function(varuna_web_assets)
  set(target varuna_web_assets)
  if(ARGC GREATER 0)
    set(target "${ARGV0}")
  endif()
  set(web_src "${PROJECT_SOURCE_DIR}/web")
  set(web_bin "${CMAKE_BINARY_DIR}/web")
  set(generated "${web_bin}/web_assets.cc")
  set(embed_script "${_VARUNA_WEB_ASSETS_DIR}/embed_assets.cmake")
  file(MAKE_DIRECTORY "${web_bin}")

  if(VARUNA_WEB)
    find_program(VARUNA_NODE_EXECUTABLE NAMES node nodejs)
    find_program(VARUNA_NPM_EXECUTABLE NAMES npm)
    if(NOT VARUNA_NODE_EXECUTABLE OR NOT VARUNA_NPM_EXECUTABLE)
      message(FATAL_ERROR "The web dashboard needs node and npm (apt-get install nodejs npm), "
                          "or configure with -DVARUNA_WEB=OFF for a placeholder page.")
    endif()

    set(dist "${web_bin}/dist")
    set(node_modules "${web_bin}/node_modules")
    set(npm_stamp "${web_bin}/npm-ci.stamp")
    add_custom_command(
      OUTPUT "${npm_stamp}"
      COMMAND "${CMAKE_COMMAND}" -E copy_if_different
              "${web_src}/package.json" "${web_src}/package-lock.json" "${web_bin}/"
      COMMAND "${VARUNA_NPM_EXECUTABLE}" ci --prefix "${web_bin}" --no-audit --no-fund
              --loglevel=error
      COMMAND "${CMAKE_COMMAND}" -E touch "${npm_stamp}"
      DEPENDS "${web_src}/package.json" "${web_src}/package-lock.json"
      COMMENT "npm ci for the web dashboard"
      VERBATIM)

    file(GLOB web_sources CONFIGURE_DEPENDS "${web_src}/src/*")
    set(dist_files "${dist}/index.html" "${dist}/app.js" "${dist}/app.css")
    add_custom_command(
      OUTPUT ${dist_files}
      COMMAND "${CMAKE_COMMAND}" -E env "NODE_PATH=${node_modules}"
              "${VARUNA_NODE_EXECUTABLE}" "${web_src}/build.mjs" "${dist}"
              --node_modules "${node_modules}"
      DEPENDS "${npm_stamp}" "${web_src}/build.mjs" ${web_sources}
      WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
      COMMENT "Bundling the web dashboard (esbuild)"
      VERBATIM)
  else()
    # A page that says how to get the real one; no node or npm needed.
    set(dist "${web_bin}/placeholder")
    file(MAKE_DIRECTORY "${dist}")
    file(WRITE "${dist}/index.html"
         "<!doctype html><html><head><meta charset=\"utf-8\"><title>Varuna</title></head>"
         "<body><p>The dashboard was not built (VARUNA_WEB=OFF). The JSON API is under "
         "<a href=\"api/v1/jobs\">/api/v1/</a>.</p></body></html>\n")
    file(WRITE "${dist}/app.js" "")
    file(WRITE "${dist}/app.css" "")
    set(dist_files "${dist}/index.html" "${dist}/app.js" "${dist}/app.css")
  endif()

  add_custom_command(
    OUTPUT "${generated}"
    COMMAND "${CMAKE_COMMAND}" "-DDIST=${dist}" "-DOUT=${generated}" -P "${embed_script}"
    DEPENDS ${dist_files} "${embed_script}"
    COMMENT "Embedding the web dashboard into web_assets.cc"
    VERBATIM)

  add_library(${target} STATIC "${generated}" "${PROJECT_SOURCE_DIR}/manager/api/web_assets.h")
  target_include_directories(${target} PUBLIC "${PROJECT_SOURCE_DIR}")
endfunction()
