# `cmake --install` and the Debian package (`scripts/package DIR`, CPack DEB; docs/operations.md).
# Paths are those of the package: CPack installs under /usr (CPACK_PACKAGING_INSTALL_PREFIX), and
# the configuration, unit and state paths are absolute so that `cmake --install --prefix P` puts
# the binary under P and leaves /etc and /lib/systemd to the package.
include(GNUInstallDirs)

install(TARGETS gpufleet RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT gpufleet)
install(FILES deploy/etc/server.yaml deploy/etc/agent.yaml
        DESTINATION /etc/gpufleet COMPONENT gpufleet)
install(FILES deploy/systemd/gpufleet-server.service deploy/systemd/gpufleet-agent.service
        DESTINATION /lib/systemd/system COMPONENT gpufleet)
install(DIRECTORY DESTINATION /var/lib/gpufleet COMPONENT gpufleet)
# The bash completion of every subcommand and flag (made after each build of the binary, in
# apps/gpufleet/CMakeLists.txt).
install(FILES ${CMAKE_BINARY_DIR}/gpufleet.bash
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME gpufleet
        COMPONENT gpufleet)
install(FILES README.md docs/operations.md docs/api.md docs/agent.md docs/ha.md docs/telemetry.md
              docs/containers.md docs/reliability.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT gpufleet)
install(FILES deploy/prometheus/gpufleet-alerts.yaml deploy/prometheus/prometheus.yml
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples/prometheus COMPONENT gpufleet)
install(FILES deploy/grafana/gpufleet-control-plane.json
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples/grafana COMPONENT gpufleet)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME gpufleet)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "gpufleet")
set(CPACK_PACKAGE_CONTACT "gpufleet maintainers <gpufleet@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "GPU cluster manager: control-plane server and node agent")
string(CONCAT CPACK_PACKAGE_DESCRIPTION
  "gpufleet schedules GPU jobs onto a fleet of nodes. One binary, /usr/bin/gpufleet: `gpufleet "
  "server` (REST API, scheduler; unit gpufleet-server.service, as the gpufleet user) and "
  "`gpufleet agent` (node agent; unit gpufleet-agent.service, as root).")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # gpufleet_VERSION_amd64.deb
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# The shared libraries' packages (libfmt9, libyaml-cpp0.7, libsqlite3-0, libpq5, libssl3, ...)
# come from dpkg-shlibdeps; adduser is what postinst runs.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
# The container runner (docs/containers.md); PostgreSQL for a store shared by several servers
# (docs/ha.md); Prometheus for the alert rules.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "podman, runc, catatonit")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "postgresql, prometheus")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/deploy/debian/postinst ${PROJECT_SOURCE_DIR}/deploy/debian/prerm
    ${PROJECT_SOURCE_DIR}/deploy/debian/postrm ${PROJECT_SOURCE_DIR}/deploy/debian/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_STRIP_FILES ON)  # as Debian ships binaries; the build tree keeps the debug info
include(CPack)
