# `cmake --install` rules: programs, the client library with its public headers, the default
# config, the systemd unit, the Prometheus scrape config and the Grafana dashboard, in the
# GNUInstallDirs places. Included at the end of the top-level CMakeLists.txt, once every target
# exists, so `if(TARGET ...)` sees them all.
#
# Layout with the default prefix /usr/local:
#   bin/kvtierd bin/kvtierctl [bin/kvtier-run]
#   lib/libkvtier_client.a (+ the static kvtier libraries it needs), lib/pkgconfig/kvtier-client.pc
#   include/kvtier/client.h include/kvtier/v1/kvtier.{pb,grpc.pb}.h
#   /etc/kvtier/kvtierd.toml          (installed only when absent: an operator's edits survive)
#   share/kvtier/kvtierd.toml         (the packaged defaults, always refreshed, for diffing)
#   lib/systemd/system/kvtierd.service  share/kvtier/{prometheus.yml,kvtier-alerts.yml,kvtier.json,k8s/}
#
# The config belongs in /etc even for a /usr/local install (a daemon's config is looked for
# there), so CMAKE_INSTALL_SYSCONFDIR defaults to /etc unless the prefix is /usr (GNUInstallDirs
# already maps that to /etc) or the caller sets it.
if(NOT DEFINED CACHE{CMAKE_INSTALL_SYSCONFDIR} AND CMAKE_INSTALL_PREFIX STREQUAL "/usr/local")
  set(CMAKE_INSTALL_SYSCONFDIR /etc CACHE PATH "read-only single-machine data (DIR/kvtier)")
endif()
include(GNUInstallDirs)

set(KVTIER_SYSTEMD_UNITDIR "${CMAKE_INSTALL_PREFIX}/lib/systemd/system"
    CACHE PATH "Where kvtierd.service is installed")
set(kvtier_config_dir ${CMAKE_INSTALL_FULL_SYSCONFDIR}/kvtier)
set(kvtier_data_dir ${CMAKE_INSTALL_DATADIR}/kvtier)

# ---- programs ----
foreach(program kvtierd kvtierctl kvtier-run)
  if(TARGET ${program})
    install(TARGETS ${program} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
  endif()
endforeach()

# The static kvtier libraries `target` links, itself first, dependencies after their users (the
# order a static link line needs). Header-only (INTERFACE) ones are skipped.
function(kvtier_static_closure target out)
  set(order "")
  set(pending ${target})
  set(steps 0)
  while(pending)
    math(EXPR steps "${steps} + 1")
    if(steps GREATER 10000)
      message(FATAL_ERROR "kvtier_static_closure(${target}): dependency cycle")
    endif()
    list(POP_FRONT pending lib)
    if(lib MATCHES "^kvtier::(.*)$")
      set(lib kvtier_${CMAKE_MATCH_1})
    endif()
    if(NOT lib MATCHES "^kvtier_" OR NOT TARGET ${lib})
      continue()
    endif()
    get_target_property(type ${lib} TYPE)
    if(type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(deps ${lib} INTERFACE_LINK_LIBRARIES)
    else()
      list(REMOVE_ITEM order ${lib})  # a later user moves it after that user
      list(APPEND order ${lib})
      get_target_property(deps ${lib} LINK_LIBRARIES)
    endif()
    if(deps)
      list(APPEND pending ${deps})
    endif()
  endwhile()
  set(${out} ${order} PARENT_SCOPE)
endfunction()

# ---- client library: libkvtier_client and the static kvtier libraries it links ----
if(TARGET kvtier_client)
  kvtier_static_closure(kvtier_client kvtier_client_libs)
  set(KVTIER_PC_LIBS "")
  foreach(lib ${kvtier_client_libs})
    install(TARGETS ${lib} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel)
    string(REGEX REPLACE "^kvtier_" "" name ${lib})
    string(APPEND KVTIER_PC_LIBS " -lkvtier_${name}")
  endforeach()
  string(APPEND KVTIER_PC_LIBS " -lrt")
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/client/include/kvtier
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT devel FILES_MATCHING PATTERN "*.h")
  # client.h includes "kvtier/v1/kvtier.pb.h": the generated contract is public too.
  install(FILES ${PROJECT_BINARY_DIR}/proto/gen/kvtier/v1/kvtier.pb.h
                ${PROJECT_BINARY_DIR}/proto/gen/kvtier/v1/kvtier.grpc.pb.h
                ${PROJECT_SOURCE_DIR}/proto/kvtier/v1/kvtier.proto
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvtier/v1 COMPONENT devel)
  configure_file(${PROJECT_SOURCE_DIR}/deploy/kvtier-client.pc.in
                 ${PROJECT_BINARY_DIR}/deploy/kvtier-client.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/deploy/kvtier-client.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT devel)
endif()

# ---- config ----
install(FILES ${PROJECT_SOURCE_DIR}/deploy/kvtierd.toml DESTINATION ${kvtier_data_dir}
        COMPONENT runtime)
# Never overwrite an operator's /etc/kvtier/kvtierd.toml; the fresh defaults sit in share/.
install(CODE "
  set(dest \"\$ENV{DESTDIR}${kvtier_config_dir}/kvtierd.toml\")
  if(EXISTS \"\${dest}\")
    message(STATUS \"Keeping existing: \${dest} (defaults: ${CMAKE_INSTALL_FULL_DATADIR}/kvtier/kvtierd.toml)\")
  else()  # file(INSTALL) prepends DESTDIR itself
    file(INSTALL DESTINATION \"${kvtier_config_dir}\" TYPE FILE
         FILES \"${PROJECT_SOURCE_DIR}/deploy/kvtierd.toml\")
  endif()" COMPONENT runtime)

# ---- systemd unit, with ExecStart and the config path of this install ----
file(READ ${PROJECT_SOURCE_DIR}/deploy/kvtierd.service kvtier_unit)
string(REPLACE "/usr/bin/kvtierd" "${CMAKE_INSTALL_FULL_BINDIR}/kvtierd" kvtier_unit
               "${kvtier_unit}")
string(REPLACE "/etc/kvtier/" "${kvtier_config_dir}/" kvtier_unit "${kvtier_unit}")
file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/deploy/kvtierd.service CONTENT "${kvtier_unit}"
     @ONLY)
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             ${PROJECT_SOURCE_DIR}/deploy/kvtierd.service)
install(FILES ${PROJECT_BINARY_DIR}/deploy/kvtierd.service DESTINATION ${KVTIER_SYSTEMD_UNITDIR}
        COMPONENT runtime)

# ---- monitoring and Kubernetes examples ----
install(FILES ${PROJECT_SOURCE_DIR}/deploy/prometheus.yml
              ${PROJECT_SOURCE_DIR}/deploy/kvtier-alerts.yml
              ${PROJECT_SOURCE_DIR}/dashboards/kvtier.json
        DESTINATION ${kvtier_data_dir} COMPONENT runtime)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/deploy/k8s DESTINATION ${kvtier_data_dir}
        COMPONENT runtime)

# ---- the layout, for tests/integration/deploy/install_test.sh ----
set(kvtier_installed_programs "")
foreach(program kvtierd kvtierctl kvtier-run)
  if(TARGET ${program})
    string(APPEND kvtier_installed_programs " ${program}")
  endif()
endforeach()
file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/deploy/install-layout.env CONTENT "\
prefix='${CMAKE_INSTALL_PREFIX}'
bindir='${CMAKE_INSTALL_FULL_BINDIR}'
libdir='${CMAKE_INSTALL_FULL_LIBDIR}'
includedir='${CMAKE_INSTALL_FULL_INCLUDEDIR}'
sysconfdir='${CMAKE_INSTALL_FULL_SYSCONFDIR}'
datadir='${CMAKE_INSTALL_FULL_DATADIR}'
unitdir='${KVTIER_SYSTEMD_UNITDIR}'
programs='${kvtier_installed_programs}'
")
