// SPDX-License-Identifier: Apache-2.0
#pragma once

// cpp-httplib for the agent module, with the feature macros Debian 12's libcpp-httplib.so was
// built with (OpenSSL, zlib, brotli): every translation unit must see the same ones or the class
// layouts differ. The api module has the same header (api/http.h); agent does not depend on api.
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
