#ifndef KVTIER_DAEMON_KVTIERD_STATUS_PAGE_H_
#define KVTIER_DAEMON_KVTIERD_STATUS_PAGE_H_

// kvtierd's status page (`/` beside `/metrics`): the figures of `kvtierctl top`, the pools and the
// host links' grants as plain HTML with inline SVG bars — no script, no external asset, every
// text escaped. Names, pids and tags are left out (client/kvtierctl/status_view.h, `redact`):
// whoever reaches the metrics address reads the page. Pure.

#include <string>

#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::daemon {

// `refresh_seconds` > 0: the page asks the browser to reload it that often (a meta refresh).
std::string RenderStatusPage(const v1::GetStatusResponse& status, int refresh_seconds = 5);

// Text for HTML element content and attribute values (& < > " ').
std::string EscapeHtml(const std::string& text);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_KVTIERD_STATUS_PAGE_H_
