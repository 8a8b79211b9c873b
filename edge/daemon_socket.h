#ifndef KVTIER_EDGE_DAEMON_SOCKET_H_
#define KVTIER_EDGE_DAEMON_SOCKET_H_

// Where kvtier's programs find kvtierd, decided in one place so that kvtierd, kvtierctl and
// kvtier-run (and the Python package, which mirrors it) agree: a --socket flag, else
// $KVTIER_SOCKET, else the program's fallback (the host's daemon at /run/kvtier/kvtierd.sock,
// or kvtierd's server.socket). Errors name the path tried and where it came from.

#include <optional>
#include <string>

namespace kvtier::edge {

// The host's daemon: the socket the packaged unit and config use.
inline constexpr char kDefaultSocketPath[] = "/run/kvtier/kvtierd.sock";
// Names the socket for every program when no --socket is given.
inline constexpr char kSocketEnv[] = "KVTIER_SOCKET";

struct SocketChoice {
  std::string path;
  std::string origin;  // "--socket", "KVTIER_SOCKET", "the default", "server.socket in FILE"

  // "/run/kvtier/kvtierd.sock (the default; --socket or KVTIER_SOCKET picks another)".
  std::string Describe() const;
};

// `flag` when given, else $KVTIER_SOCKET when set and not empty, else `fallback`.
SocketChoice ChooseSocket(const std::optional<std::string>& flag,
                          const std::string& fallback = kDefaultSocketPath,
                          const std::string& fallback_origin = "the default");

// Why a client could not use the socket at `path`, in words an operator can act on (nothing
// there: is kvtierd running; no permission: join the socket's group; not a socket); "" when
// the path is a socket this process may connect to.
std::string SocketProblem(const std::string& path);

}  // namespace kvtier::edge

#endif  // KVTIER_EDGE_DAEMON_SOCKET_H_
