// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace gpufleet::http_testing {

// A raw loopback connection, so that tests can send what no well-behaved client would.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval timeout{};
    timeout.tv_sec = 5;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~RawConnection() { ::close(fd_); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return connected_; }

  bool Send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }

  // Everything the server sends until it closes the connection (or 5 s pass).
  std::string ReadAll() {
    std::string out;
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) {
        return out;
      }
      out.append(buffer, static_cast<size_t>(n));
    }
  }

  // Reads until `marker` has been seen `count` times (or the connection ends).
  std::string ReadUntil(const std::string& marker, int count = 1) {
    std::string out;
    char buffer[4096];
    while (Count(out, marker) < count) {
      const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) {
        break;
      }
      out.append(buffer, static_cast<size_t>(n));
    }
    return out;
  }

  // True when the server has closed the connection.
  bool Closed() {
    char byte = 0;
    return ::recv(fd_, &byte, 1, 0) == 0;
  }

  static int Count(const std::string& text, const std::string& marker) {
    int n = 0;
    for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + 1)) {
      ++n;
    }
    return n;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

}  // namespace gpufleet::http_testing
