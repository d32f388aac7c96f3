// SPDX-License-Identifier: Apache-2.0
#pragma once

// The one include of cpp-httplib in gpufleet. Debian 12's libcpp-httplib-dev ships the split
// header plus libcpp-httplib.so, compiled with OpenSSL, zlib and brotli; every translation unit
// must see the same feature macros as that library or the class layouts differ (ODR). Link
// `gpufleet::http`, which links the library together with OpenSSL, zlib and brotli.
#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#define CPPHTTPLIB_OPENSSL_SUPPORT
#endif
#ifndef CPPHTTPLIB_ZLIB_SUPPORT
#define CPPHTTPLIB_ZLIB_SUPPORT
#endif
#ifndef CPPHTTPLIB_BROTLI_SUPPORT
#define CPPHTTPLIB_BROTLI_SUPPORT
#endif

#include <httplib.h>  // IWYU pragma: export
