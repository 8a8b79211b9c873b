#!/usr/bin/env python3
"""Writes dashboards/kvtier.json, the Grafana dashboard for kvtierd.

Edit the panels here and run `python3 dashboards/generate.py`; commit both files. Every metric
name must be one that daemon/metrics.h defines: the unit test dashboard_metrics_test checks it,
and the integration test prometheus_scrape_test evaluates every expression against a real
Prometheus scraping a real daemon.
"""
import json
import pathlib

DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'instance=~"$instance"'
RATE = "$__rate_interval"


class Layout:
    """Places panels left to right, 24 columns per line, one row header per concern."""

    def __init__(self):
        self.panels, self.y, self.x, self.next_id = [], 0, 0, 1

    def _id(self):
        self.next_id += 1
        return self.next_id - 1

    def row(self, title):
        if self.x:
            self.y, self.x = self.y + 8, 0
        self.panels.append({"type": "row", "title": title, "id": self._id(), "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def panel(self, title, targets, unit, kind="timeseries", width=12, description="",
              stack=False, minimum=None):
        if self.x + width > 24:
            self.y, self.x = self.y + 8, 0
        defaults = {"unit": unit, "custom": {}}
        if minimum is not None:
            defaults["min"] = minimum
        if kind == "timeseries":
            defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                                  "stacking": {"mode": "normal" if stack else "none"}}
        p = {"type": kind, "title": title, "id": self._id(), "datasource": DS,
             "description": description,
             "gridPos": {"h": 8, "w": width, "x": self.x, "y": self.y},
             "fieldConfig": {"defaults": defaults, "overrides": []},
             "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                         "tooltip": {"mode": "multi"}} if kind == "timeseries" else
                        {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                           "values": False}, "colorMode": "value"},
             "targets": [{"datasource": DS, "expr": e, "legendFormat": l,
                          "refId": chr(ord("A") + i)} for i, (e, l) in enumerate(targets)]}
        self.panels.append(p)
        self.x += width


def build():
    d = Layout()
    d.row("HBM saved")
    d.panel("HBM saved", [(f"sum(kvtier_hbm_saved_bytes{{{SEL}}})", "saved")], "bytes",
            kind="stat", width=6,
            description="Sum over open sequences of full KV bytes minus the bytes kept in T0.")
    d.panel("HBM saved over time", [(f"kvtier_hbm_saved_bytes{{{SEL}}}", "{{instance}}")],
            "bytes", width=18, minimum=0)

    d.row("Bytes per tier")
    d.panel("Tokens per tier", [(f"sum by (tier) (kvtier_placement_tokens{{{SEL}}})",
                                 "{{tier}}")], "short", stack=True, minimum=0,
            description="Token positions of open sequences per tier (T0 HBM, T1 DDR, "
                        "T2 compressed, T3 evicted).")
    d.panel("Host pool bytes in use per tier",
            [(f"sum by (tier) (kvtier_pool_used_bytes{{{SEL}}})", "{{tier}} used"),
             (f"sum by (tier) (kvtier_pool_reserved_bytes{{{SEL}}})", "{{tier}} reserved")],
            "bytes", minimum=0)

    d.row("Pool usage vs capacity")
    d.panel("Pool usage vs capacity",
            [(f"sum by (tier) (kvtier_pool_used_bytes{{{SEL}}})", "{{tier}} used"),
             (f"sum by (tier) (kvtier_pool_capacity_bytes{{{SEL}}})", "{{tier}} capacity")],
            "bytes", minimum=0)
    d.panel("Pool usage (share of capacity)",
            [(f"sum by (tier) (kvtier_pool_used_bytes{{{SEL}}}) / "
              f"sum by (tier) (kvtier_pool_capacity_bytes{{{SEL}}})", "{{tier}}")],
            "percentunit", width=6, minimum=0)
    d.panel("Slot allocation failures",
            [(f"sum by (tier, reason) (rate(kvtier_pool_allocation_failures_total{{{SEL}}}"
              f"[{RATE}]))", "{{tier}} {{reason}}")], "ops", width=6, minimum=0)

    d.row("Plan latency")
    d.panel("Plan latency p50 / p99",
            [(f"histogram_quantile(0.5, sum by (le) (rate(kvtier_plan_latency_seconds_bucket"
              f"{{{SEL}}}[{RATE}])))", "p50"),
             (f"histogram_quantile(0.99, sum by (le) (rate(kvtier_plan_latency_seconds_bucket"
              f"{{{SEL}}}[{RATE}])))", "p99")], "s", minimum=0,
            description="SubmitSnapshot handling time in the daemon: validation, policy, plan, "
                        "slot allocation.")
    d.panel("Snapshots and acknowledgements",
            [(f"sum(rate(kvtier_snapshots_total{{{SEL}}}[{RATE}]))", "snapshots"),
             (f"sum by (result) (rate(kvtier_plan_acks_total{{{SEL}}}[{RATE}]))",
              "acks {{result}}")], "ops", minimum=0)

    d.row("Bytes moved")
    d.panel("Bytes planned per direction",
            [(f"sum by (kind) (rate(kvtier_plan_moved_bytes_total{{{SEL}}}[{RATE}]))",
              "{{kind}}")], "Bps", minimum=0,
            description="offload T0->T1, compress ->T2, promote ->T0, decompress T2->T1.")
    d.panel("Moves per kind", [(f"sum by (kind) (rate(kvtier_plan_moves_total{{{SEL}}}"
                                f"[{RATE}]))", "{{kind}}")], "ops", minimum=0)

    d.row("Evictions")
    d.panel("Evicted tokens", [(f"sum(rate(kvtier_plan_evicted_tokens_total{{{SEL}}}"
                                f"[{RATE}]))", "evicted/s")], "short", width=8, minimum=0)
    d.panel("Cumulative evicted fraction (open sequences)",
            [(f'sum(kvtier_placement_tokens{{tier="T3",{SEL}}}) / '
              f"sum(kvtier_placement_tokens{{{SEL}}})", "evicted")], "percentunit", width=8,
            minimum=0,
            description="Evicted share of all token positions of open sequences: the knob "
                        "that governs accuracy (never only the per-round ratio).")
    d.panel("Evicted tokens, total", [(f"sum(kvtier_plan_evicted_tokens_total{{{SEL}}})",
                                       "total")], "short", kind="stat", width=8)

    d.row("Quality guardrail")
    d.panel("Attention mass not served exactly (per snapshot)",
            [(f"histogram_quantile({q}, sum by (le) (rate(kvtier_sequence_lost_mass_ratio_bucket"
              f"{{part=\"total\",{SEL}}}[{RATE}])))", f"p{int(q * 100)}")
             for q in (0.5, 0.9, 0.99)], "percentunit", minimum=0,
            description="Share of a decode step's attention that sequences could not serve "
                        "exactly: T2 pages' mass weighted by their measured codec error plus the "
                        "evicted pages' estimated mass (docs/tiering.md). Alerts: "
                        "deploy/kvtier-alerts.yml.")
    d.panel("Lost mass by part, p90",
            [(f"histogram_quantile(0.9, sum by (part, le) (rate("
              f"kvtier_sequence_lost_mass_ratio_bucket{{{SEL}}}[{RATE}])))", "{{part}}")],
            "percentunit", minimum=0,
            description="compressed: T2 mass x codec error (observed); evicted: the estimate "
                        "for evicted pages; total: their sum.")

    d.row("Degraded plans")
    d.panel("Degraded plans by reason",
            [(f"sum by (reason) (rate(kvtier_plan_degraded_total{{{SEL}}}[{RATE}]))",
              "{{reason}}")], "ops", minimum=0,
            description="Plans that left pages in T0 because a pool or quota was short.")
    d.panel("Protected pages over the T0 budget",
            [(f"sum(rate(kvtier_plan_protected_overflow_total{{{SEL}}}[{RATE}]))",
              "overflow")], "ops", minimum=0)

    d.row("Workers and leases")
    d.panel("Workers and sequences",
            [(f"sum(kvtier_registry_workers{{{SEL}}})", "workers"),
             (f"sum(kvtier_registry_sequences{{{SEL}}})", "sequences")], "short", minimum=0)
    d.panel("Lease expirations", [(f"sum(increase(kvtier_lease_expirations_total{{{SEL}}}"
                                   f"[{RATE}]))", "expired")], "short", minimum=0,
            description="Workers reaped because they stopped heartbeating; their slots "
                        "returned to the pools.")

    d.row("Block store (vLLM)")
    d.panel("Block hit ratio",
            [(f"sum by (domain) (rate(kvtier_blocks_hits_total{{{SEL}}}[{RATE}])) / "
              f"(sum by (domain) (rate(kvtier_blocks_hits_total{{{SEL}}}[{RATE}])) + "
              f"sum by (domain) (rate(kvtier_blocks_misses_total{{{SEL}}}[{RATE}])))",
              "{{domain}}")], "percentunit", width=8, minimum=0,
            description="Keys engines looked up in kvtierd's node-wide block store that it "
                        "held, per trust domain kind (shared: [blocks] shared_uids; private: "
                        "every other uid on its own). docs/vllm.md.")
    d.panel("Blocks stored, evicted, dropped",
            [(f"sum by (domain) (rate(kvtier_blocks_{what}_total{{{SEL}}}[{RATE}]))",
              f"{what} {{{{domain}}}}") for what in ("stored", "evicted", "dropped")],
            "ops", width=8, minimum=0,
            description="dropped: stores refused because every slot was pending or leased "
                        "(the engine drops them, as vLLM's DropStorePolicy expects).")
    d.panel("Block store bytes and leases",
            [(f"sum by (domain) (kvtier_blocks_held_bytes{{{SEL}}})", "held {{domain}}"),
             (f"sum by (domain) (kvtier_blocks_capacity_bytes{{{SEL}}})",
              "capacity {{domain}}")], "bytes", width=8, minimum=0,
            description="Bytes of published blocks against the spaces' slots. Leases "
                        "outstanding: kvtier_blocks_leases; owners reaped: "
                        "kvtier_blocks_owners_reaped_total.")

    d.row("Errors")
    d.panel("Errors by code", [(f"sum by (code) (rate(kvtier_rpc_errors_total{{{SEL}}}"
                                f"[{RATE}]))", "{{code}}")], "ops", minimum=0)
    d.panel("Error ratio by RPC",
            [(f"sum by (rpc) (rate(kvtier_rpc_errors_total{{{SEL}}}[{RATE}])) / "
              f"sum by (rpc) (rate(kvtier_rpc_requests_total{{{SEL}}}[{RATE}]))", "{{rpc}}")],
            "percentunit", minimum=0)

    d.row("Connections")
    d.panel("Connections dropped by reason",
            [(f"sum by (reason) (increase(kvtier_connections_dropped_total{{{SEL}}}[{RATE}]))",
              "{{reason}}")], "short", minimum=0,
            description="Connections kvtierd closed because of what their peer did: a gRPC "
                        "client that left answers unread (the unread guard), or a heartbeat- or "
                        "snapshot-lane connection that left its answer unread, sent heartbeats too "
                        "fast, was refused (lease lost, another daemon's epoch, another worker's "
                        "session, a bad snapshot, a plan too large for the channel), sent "
                        "something else, or found the lane full. Each is also a warning in the "
                        "log.")
    # The memory channel's two lanes: what each keeps, and whether its thread runs real-time.
    for lane, sends, cap in (
            ("heartbeat", "heartbeats", "heartbeats come faster than 5,000 a second"),
            ("snapshot", "sends its snapshots", "snapshots take over half a core")):
        d.panel(f"{lane.capitalize()} lane",
                [(f"sum(kvtier_{lane}_lane_connections{{{SEL}}})", "kept connections"),
                 (f"min(kvtier_{lane}_lane_realtime{{{SEL}}})", "real-time (1 = SCHED_FIFO)")],
                "short", minimum=0,
                description=f"Connections the {lane} lane keeps (one per worker that {sends} "
                            "over the memory channel), and 1 while its thread runs at SCHED_FIFO: "
                            "0 when the system refused the priority (systemd: LimitRTPRIO=) or "
                            f"while {cap}.")

    return {
        "title": "kvtier",
        "uid": "kvtier-node",
        "description": "kvtierd: HBM saved, tiers, pools, plans, data movement, evictions, "
                       "quality guardrail, workers, errors and connections. Metric names: daemon/metrics.h.",
        "tags": ["kvtier"],
        "schemaVersion": 38,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0, "refresh": 1},
            {"name": "instance", "label": "Instance", "type": "query", "datasource": DS,
             "query": {"query": "label_values(kvtier_registry_workers, instance)",
                       "refId": "instance"},
             "definition": "label_values(kvtier_registry_workers, instance)",
             "includeAll": True, "multi": True, "allValue": ".+",
             "current": {"text": "All", "value": "$__all"}, "refresh": 2, "sort": 1,
             "hide": 0},
        ]},
        "panels": d.panels,
    }


if __name__ == "__main__":
    out = pathlib.Path(__file__).with_name("kvtier.json")
    out.write_text(json.dumps(build(), indent=2) + "\n")
    print(f"wrote {out}")
