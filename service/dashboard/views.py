"""The recommendation dashboard: server-rendered pages under /ui.

Signing in stores the operator's API token in an HttpOnly, SameSite=Strict cookie scoped to
/ui; every page resolves it again (a revoked token is signed out at once). Actions are forms
that carry a CSRF token (the double-submit pattern) and need the operator role: a viewer sees
them disabled, and the server refuses them anyway."""

from __future__ import annotations

import base64
import json
import secrets
import statistics
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from agent.bench.library import library
from agent.contract import histograms
from agent.contract.metrics import METRICS as MEASURED
from agent.contract.owned import owned_by
from agent.contract.tunables import DeviceConfig
from agent.contract.workloads import describe
from models.dataset import OBJECTIVE_METRIC
from models.features import config_label
from service.audit import service as audit
from service.dashboard import charts
from service.dashboard import service as dashboard
from service.deps import SessionDep, principal_for_token
from service.errors import BlkpilotError
from service.policies import service as policies
from service.recommendations import service as recommendations
from service.recommendations.schemas import Acceptance
from service.rollouts import service as rollouts
from service.security import SESSION_COOKIE, Principal, Role
from service.tables import Observation, Policy, TelemetryWindowRow

router = APIRouter(prefix="/ui", include_in_schema=False)
templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))


def _signed_pct(fraction: float) -> str:
    """A change as a signed percentage; one that rounds to nothing is ±0.0 (not "-0.0")."""
    shown = f"{fraction * 100:+.1f}"
    return "±0.0" if shown in ("+0.0", "-0.0") else shown


templates.env.filters["signed_pct"] = _signed_pct


def _pct_interval(low: float, high: float) -> str:
    """An interval of relative changes as people write it: "-49 … +59 %", with true minus
    signs (U+2212)."""

    def one(fraction: float) -> str:
        shown = f"{fraction * 100:+.{0 if abs(fraction) >= 0.1 else 1}f}"
        return "±0" if shown.lstrip("+-") in ("0", "0.0") else shown.replace("-", "\u2212")

    return f"{one(low)} … {one(high)} %"


def _gain_class(gain: float, low: float | None = None, high: float | None = None) -> str:
    """Green only where the interval clears zero (better), red where it is all below zero
    (worse); a point gain whose interval straddles zero is shown plain, however large."""
    if low is not None and high is not None:
        return "better" if low > 0 else ("worse" if high < 0 else "same")
    return "better" if gain > 0.0005 else ("worse" if gain < -0.0005 else "same")


def human(value: float | None, unit: str = "") -> str:
    """A measured value in the units people read: 27.9k I/O per s, 10.7 µs, 1.2 ms."""
    if value is None:
        return "—"
    if unit == "µs" and abs(value) >= 1_000:
        value, unit = (value / 1_000, "ms") if abs(value) < 1_000_000 else (value / 1e6, "s")
    suffix = ""
    if unit != "µs" and unit not in ("ms", "s"):
        for scale, letter in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(value) >= scale:
                value, suffix = value / scale, letter
                break
    return f"{value:.3g}{suffix} {unit}".strip()


def _workload_words(name: str) -> str:
    """A named workload as people say it ("4 KiB random reads, one at a time")."""
    known = library().get(name)
    return describe(known) if known is not None else name


def _audit_detail(detail: str, after: dict[str, Any] | None) -> str:
    """An event's detail, or where it has none, what it changed as "name: value" pairs —
    a configuration as its label — not a Python dict."""
    if detail or not after:
        return detail
    parts = []
    for key, value in after.items():
        if key == "config" and isinstance(value, dict):
            shown = _key(value)
        elif isinstance(value, dict | list):
            shown = json.dumps(value, separators=(", ", ": "))[:200]
        else:
            shown = str(value)
        parts.append(f"{key.replace('_', ' ')}: {shown}")
    return "; ".join(parts)


templates.env.filters["audit_detail"] = _audit_detail
templates.env.filters["pct_interval"] = _pct_interval
templates.env.filters["gain_class"] = _gain_class
templates.env.filters["human"] = human
templates.env.filters["workload_words"] = _workload_words
templates.env.filters["owned_by"] = owned_by


def _when(moment: datetime | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """A timestamp with its time zone, always UTC (the service's and the audit's clock)."""
    if moment is None:
        return "—"
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return f"{moment.strftime(fmt)} UTC"


templates.env.filters["when"] = _when


def _live_lines(statistics: dict[str, float]) -> list[str]:
    """A live canary's evidence beside its verdict, a line each (agent.live_canary's
    live_statistics): the loop and the data-rate rule, each class's weight and gain (as
    everywhere: higher is better, so a slower candidate shows a negative gain), the pairs set
    aside and the classes left out, with why."""
    lines = []
    if "live.loop_closed" in statistics:
        loop = {1.0: "closed", 0.0: "open"}.get(statistics["live.loop_closed"], "unknown")
        rule = "applied" if statistics.get("live.data_rate_rule") else "not applied"
        lines.append(f"{loop}-loop application: the data-rate rule {rule}")
    classes: dict[str, dict[str, float]] = {}
    aside, left = [], []
    for key, value in sorted(statistics.items()):
        parts = key.split(".")
        if key.startswith("live.class.") and len(parts) == 4:
            classes.setdefault(parts[2], {})[parts[3]] = value
        elif key.startswith("live.set_aside."):
            aside.append(f"{parts[2].replace('_', ' ')} {value:.0f}")
        elif key.startswith("live.left_out."):
            left.append(f"{parts[2].replace('_', ' ')} in {value:.0f}")
    if classes:
        lines.append(
            "per class, gain (p50 / p99; higher is better): "
            + "; ".join(
                f"{name.replace('_', ' ')} ({100 * c.get('weight', 0):.0f} % of the mix):"
                f" {_signed_pct(-c.get('p50_shift', 0))} % /"
                f" {_signed_pct(-c.get('p99_shift', 0))} %"
                for name, c in sorted(classes.items(), key=lambda item: -item[1].get("weight", 0))
            )
        )
    if aside:
        lines.append(f"pairs set aside: {', '.join(aside)}")
    if left:
        lines.append(f"a class one half lacked, left out of those pairs: {', '.join(left)}")
    return lines


templates.env.filters["live_lines"] = _live_lines
SESSION, CSRF = SESSION_COOKIE, "blkpilot_csrf"
METRICS = {  # the benchmark table's columns: label and unit from the one definition
    name: (MEASURED[name].label, MEASURED[name].unit)
    for name in (
        "lat_p50_us",
        "lat_p99_us",
        "iops",
        "bytes_per_joule",
        "worst_slowdown_over_proportional",
    )
}


class SignIn(Exception):
    """No valid session: go to the sign-in page."""


def _principal(request: Request, session: SessionDep) -> Principal:
    token = request.cookies.get(SESSION, "")
    principal = principal_for_token(session, token) if token else None
    if principal is None or principal.is_node:
        raise SignIn
    return principal


AGREEMENT_HELP = (
    "the share of the model's ensemble members that rank the recommended configuration first"
    " for the lead objective: how settled the ranking is, not the chance that it helps"
)


def _page(
    request: Request, name: str, principal: Principal | None, status: int = 200, **context: Any
) -> HTMLResponse:
    return templates.TemplateResponse(
        request,
        name,
        {
            "principal": principal,
            "csrf": request.cookies.get(CSRF, ""),
            "operator": bool(principal and principal.can(Role.OPERATOR)),
            "message": request.query_params.get("message", ""),
            "agreement_help": AGREEMENT_HELP,
            **context,
        },
        status_code=status,
    )


def _act(request: Request, session: SessionDep, csrf: str) -> Principal:
    """An action: signed in, the CSRF token matching, the operator role."""
    principal = _principal(request, session)
    expected = request.cookies.get(CSRF, "")
    if not expected or not secrets.compare_digest(expected, csrf):
        raise ActionRefused(403, "the form is stale or did not come from this dashboard")
    if not principal.can(Role.OPERATOR):
        raise ActionRefused(403, f"this needs the operator role; {principal.name} is a viewer")
    return principal


class ActionRefused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def install(app: Any) -> None:
    """Add the dashboard and its error handling to the application."""
    app.include_router(router)

    async def sign_in(request: Request, _: Exception) -> Response:
        response = RedirectResponse(f"/ui/login?next={request.url.path}", status_code=303)
        response.delete_cookie(SESSION, path="/ui")
        return response

    async def refused(request: Request, error: Exception) -> Response:
        assert isinstance(error, ActionRefused)
        return _page(request, "error.html", None, status=error.status, detail=error.detail)

    app.add_exception_handler(SignIn, sign_in)
    app.add_exception_handler(ActionRefused, refused)


# --- signing in ------------------------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/ui/") -> HTMLResponse:
    return _page(request, "login.html", None, next=next if next.startswith("/ui") else "/ui/")


@router.post("/login")
def login(
    request: Request,
    session: SessionDep,
    token: Annotated[str, Form()],
    next: Annotated[str, Form()] = "/ui/",
) -> Response:
    principal = principal_for_token(session, token.strip())
    if principal is None or principal.is_node:
        refused = "That is not an operator or viewer token (or it was revoked)."
        return _page(request, "login.html", None, status=401, next=next, error=refused)
    response = RedirectResponse(next if next.startswith("/ui") else "/ui/", status_code=303)
    secure = request.url.scheme == "https"
    response.set_cookie(
        SESSION,
        token.strip(),
        httponly=True,
        samesite="strict",
        path="/ui",
        secure=secure,
        max_age=12 * 3600,
    )
    response.set_cookie(
        CSRF,
        secrets.token_urlsafe(24),
        httponly=True,
        samesite="strict",
        path="/ui",
        secure=secure,
        max_age=12 * 3600,
    )
    return response


@router.post("/logout")
def logout() -> Response:
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(SESSION, path="/ui")
    response.delete_cookie(CSRF, path="/ui")
    return response


# --- pages -----------------------------------------------------------------------------------


def _key(config: dict[str, Any] | None) -> str:
    return config_label(DeviceConfig.model_validate(config)) if config else "—"


def _measured(
    observations: Sequence[Observation], workload: str, config: str
) -> dict[str, tuple[float, int]]:
    """Per metric, the median of the device's own benchmark runs of this workload under this
    configuration (canary baselines included), and how many: what a card shows as measured
    beside what the model predicts."""
    values: dict[str, list[float]] = defaultdict(list)
    for o in observations:
        if o.kind != "benchmark" or o.workload_name != workload or _key(o.configuration) != config:
            continue
        for metric, value in o.metrics.items():
            if isinstance(value, int | float):
                values[metric].append(float(value))
    return {metric: (statistics.median(v), len(v)) for metric, v in values.items()}


def _completion(policy: Policy | None) -> str:
    config = (policy.applied_config or policy.config) if policy else None
    return (config or {}).get("completion") or "interrupt"


def _cursor(after: tuple[str, str] | None) -> str | None:
    if after is None:
        return None
    return base64.urlsafe_b64encode(json.dumps(list(after)).encode()).decode()


def _after(cursor: str | None) -> tuple[str, str] | None:
    if not cursor:
        return None
    try:
        host, name = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (ValueError, TypeError):
        raise ActionRefused(422, "not a page of the device list: start from the first") from None
    return str(host), str(name)


@router.get("/", response_class=HTMLResponse)
def overview(request: Request, session: SessionDep, after: str | None = None) -> HTMLResponse:
    principal = _principal(request, session)
    fleet = dashboard.fleet(session, after=_after(after))
    rows = fleet.devices
    classes = Counter(fleet.counts["classes"])
    schedulers = Counter(fleet.counts["schedulers"])
    completions = Counter(fleet.counts["completions"])
    pending = recommendations.list_recommendations(
        session, device_id=None, status="proposed", objective=None, limit=200, offset=0
    )
    names = dashboard.device_names(session, (row.device_id for row in pending))
    changes: list[dict[str, Any]] = []
    keeps: list[dict[str, Any]] = []
    for row in pending:
        read = recommendations.to_read(row)
        proposal = {
            "row": read,
            "device": names.get(row.device_id, str(row.device_id)),
            "current": _key(row.current_config),
            "recommended": _key(row.recommended_config),
            "prediction": read.predictions.get(row.objective),
        }
        (changes if proposal["current"] != proposal["recommended"] else keeps).append(proposal)
    statuses = recommendations.counts_by_status(session)
    # the largest predicted gain first: what an operator should look at
    changes.sort(key=lambda p: -(p["prediction"].gain if p["prediction"] else 0.0))
    active = [r for r in rollouts.list_rollouts(session, status=None, limit=20, offset=0)]
    charts_ = {
        "classes": charts.bars(
            "Devices by class", list(classes), list(classes.values()), "devices", counts=True
        )
        if classes
        else None,
        "schedulers": charts.bars(
            "Current scheduler", list(schedulers), list(schedulers.values()), "devices", counts=True
        )
        if schedulers
        else None,
        "completions": charts.bars(
            "Completion mode", list(completions), list(completions.values()), "devices", counts=True
        )
        if completions
        else None,
    }
    tuning = getattr(request.app.state, "tuning", None)  # the demo's first tuning, under way
    return _page(
        request,
        "overview.html",
        principal,
        tuning=None if tuning is None or tuning.done or not tuning.step else tuning.said(),
        devices=rows,
        next_page=_cursor(fleet.next_after),
        first_page=after is not None,
        device_count=sum(classes.values()),
        proposals=changes,
        keeps=keeps,
        statuses=statuses,
        rollouts=active,
        charts=charts_,
        classes=classes,
    )


def _benchmarks(observations: list[Observation], workload: str | None) -> dict[str, Any]:
    by_workload = Counter(o.workload_name for o in observations)
    if not by_workload:
        return {"workloads": [], "workload": None, "table": [], "charts": []}
    chosen = workload if workload in by_workload else by_workload.most_common(1)[0][0]
    cells: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for observation in observations:
        if observation.workload_name != chosen:
            continue
        key = _key(observation.configuration)
        for metric in METRICS:
            value = observation.metrics.get(metric)
            if isinstance(value, int | float) and value > 0:
                cells[key][metric].append(float(value))
    table: list[dict[str, Any]] = []
    for key, values in sorted(cells.items()):
        table.append(
            {
                "config": key,
                "runs": max(len(v) for v in values.values()) if values else 0,
                **{m: statistics.fmean(v) for m, v in values.items()},
            }
        )
    figures = []
    for metric, (label, unit) in METRICS.items():
        measured = [row for row in table if metric in row]
        if measured:
            figures.append(
                charts.bars(
                    f"{label} — {chosen}",
                    [r["config"] for r in measured],
                    [r[metric] for r in measured],
                    unit,
                )
            )
    return {"workloads": sorted(by_workload), "workload": chosen, "table": table, "charts": figures}


def _distribution(windows: Sequence[TelemetryWindowRow]) -> Markup:
    """Reads' and writes' device time over the windows shown, merged."""
    series: dict[str, list[tuple[float, float, int]]] = {}
    for op in ("read", "write"):
        merged = histograms.merge(
            [tuple(pair) for pair in o["device_ns"]]
            for w in windows
            for o in w.operations or []
            if o["op"] == op
        )
        if merged:
            series[f"{op}s ({sum(c for _, c in merged)} I/Os)"] = [
                (low / 1000, high / 1000, count)
                for slot, count in merged
                for low, high in [histograms.latency_bounds(slot)]
            ]
    return charts.distribution("Latency distribution (eBPF, device time)", series)


@router.get("/devices/{device_id}", response_class=HTMLResponse)
def device_page(
    request: Request, session: SessionDep, device_id: uuid.UUID, workload: str | None = None
) -> HTMLResponse:
    principal = _principal(request, session)
    detail = dashboard.device_detail(session, device_id)
    if detail is None:
        return _page(request, "error.html", principal, status=404, detail=f"no device {device_id}")
    device, node, policy, windows = detail.device, detail.node, detail.policy, detail.windows
    telemetry = []
    if windows:
        times = [w.window_end for w in windows]
        telemetry.append(
            charts.timeline(
                "Mean latency", times, {"latency": [w.mean_latency_us for w in windows]}, "µs"
            )
        )
        telemetry.append(
            charts.timeline("IOPS", times, {"IOPS": [w.iops for w in windows]}, "I/O per s")
        )
        if any(w.p99_us is not None for w in windows):
            telemetry.append(
                charts.timeline(
                    "Latency percentiles (eBPF, device time)",
                    times,
                    {
                        "p50": [w.p50_us for w in windows],
                        "p99": [w.p99_us for w in windows],
                        "p99.9": [w.p999_us for w in windows],
                    },
                    "µs",
                )
            )
            telemetry.append(_distribution(windows))
        if any(w.power_watts is not None for w in windows):
            telemetry.append(
                charts.timeline(
                    "Node power"
                    + (
                        " (estimated from CPU time)"
                        if {w.power_scope for w in windows if w.power_watts is not None}
                        == {"estimated"}
                        else ""
                    ),
                    times,
                    {"W": [w.power_watts for w in windows]},
                    "W",
                )
            )
    if detail.hours:
        hours = [h.hour for h in detail.hours]
        ios = [h.read_ios + h.write_ios for h in detail.hours]
        telemetry.append(
            charts.timeline(
                "Hourly history (rollups, kept past the raw windows)",
                hours,
                {
                    "mean latency": [
                        h.latency_us_ios / n if n else None
                        for h, n in zip(detail.hours, ios, strict=True)
                    ],
                    "worst p99": [h.max_p99_us for h in detail.hours],
                },
                "µs",
            )
        )
    observations, recent = detail.observations, detail.recommendations
    latest = recent[0].workload_name if recent else None
    benchmarks = _benchmarks([o for o in observations if o.kind == "benchmark"], workload or latest)
    canaries = [o for o in observations if o.kind == "canary"][:50]
    proposals = []
    # the open ones first (what an operator can act on), each group newest first
    for row in sorted(recent, key=lambda r: r.status != "proposed"):
        read = recommendations.to_read(row)
        current, recommended = _key(row.current_config), _key(row.recommended_config)
        ordered = sorted(read.predictions.items(), key=lambda kv: kv[0] not in read.objectives)
        figure = (
            charts.changes(
                f"{' + '.join(read.objectives)}: {current} → {recommended}",
                [(name, p.gain, p.gain_low, p.gain_high) for name, p in ordered],
            )
            if read.predictions and current != recommended
            else None
        )
        proposals.append(
            {
                "row": read,
                "chart": figure,
                "current": current,
                "recommended": recommended,
                "measured_now": _measured(observations, row.workload_name, current),
                "measured_recommended": _measured(observations, row.workload_name, recommended),
                "metric": OBJECTIVE_METRIC.get(row.objective),  # type: ignore[call-overload]
                # the measured table: the metrics the objectives are judged by, labelled
                "measured_metrics": [
                    (p.metric, MEASURED[p.metric].label, MEASURED[p.metric].unit)
                    for p in read.predictions.values()
                    if p.metric in MEASURED
                ],
            }
        )
    events = audit.list_events(session, target_type="device", target_id=str(device_id), limit=50)
    return _page(
        request,
        "device.html",
        principal,
        device=device,
        node=node,
        policy=policy,
        telemetry=telemetry,
        benchmarks=benchmarks,
        canaries=canaries,
        proposals=proposals,
        events=events,
        key=_key,
    )


@router.post("/recommendations/{recommendation_id}/{decision}")
def decide(
    request: Request,
    session: SessionDep,
    recommendation_id: uuid.UUID,
    decision: str,
    csrf: Annotated[str, Form()],
    reason: Annotated[str, Form()] = "",
    soak_seconds: Annotated[float, Form(ge=0, le=7 * 86_400)] = 300.0,
) -> Response:
    principal = _act(request, session, csrf)
    if decision not in ("accept", "apply", "reject", "revert"):
        raise ActionRefused(404, f"no action {decision!r}")
    row = recommendations.get(session, recommendation_id)
    device_id = row.device_id
    done_as = {"accept": "accepted", "apply": "applied", "reject": "rejected", "revert": "reverted"}
    why = reason.strip() or f"{done_as[decision]} in the dashboard"
    try:
        if decision in ("accept", "apply"):
            acceptance = Acceptance(
                reason=why, without_canary=decision == "apply", soak_seconds=soak_seconds
            )
            done = recommendations.accept(session, principal, recommendation_id, acceptance)
        elif decision == "reject":
            done = recommendations.reject(session, principal, recommendation_id, why)
        else:
            done = recommendations.revert(session, principal, recommendation_id, why)
    except BlkpilotError as error:
        raise ActionRefused(error.status_code, error.detail) from error
    message = {
        "accept": "verifying: a canary tries it on the device; it is kept only if it passes",
        "apply": "applied without a canary: it is now the device's policy",
        "reject": "rejected",
        "revert": "reverted: the device goes back to what it had before",
    }[decision]
    if done.superseded:
        count = len(done.superseded)
        message += (
            f"; {count} other recommendation{'s' if count > 1 else ''} for this device"
            f" {'were' if count > 1 else 'was'} superseded by it"
        )
    return RedirectResponse(f"/ui/devices/{device_id}?message={message}", status_code=303)


@router.get("/audit", response_class=HTMLResponse)
def audit_page(
    request: Request,
    session: SessionDep,
    action: str | None = None,
    actor: str | None = None,
    target: str | None = None,
    before: int | None = None,
) -> HTMLResponse:
    """The fleet's audit log, newest first, a page at a time, filtered by action, actor or
    target (a device's, a recommendation's or a rollout's id)."""
    principal = _principal(request, session)
    filters = {
        k: v.strip()
        for k, v in {"action": action, "actor": actor, "target": target}.items()
        if v and v.strip()
    }
    events = audit.list_events(
        session,
        action=filters.get("action"),
        actor=filters.get("actor"),
        target_id=filters.get("target"),
        before_id=before,
        limit=PAGE + 1,
    )
    older = events[PAGE - 1].id if len(events) > PAGE else None
    return _page(
        request, "audit.html", principal, events=events[:PAGE], filters=filters, older=older
    )


PAGE = 100


@router.get("/rollouts", response_class=HTMLResponse)
def rollouts_page(request: Request, session: SessionDep) -> HTMLResponse:
    principal = _principal(request, session)
    rows = rollouts.list_rollouts(session, status=None, limit=200, offset=0)
    return _page(request, "rollouts.html", principal, rollouts=rows)


@router.get("/rollouts/{rollout_id}", response_class=HTMLResponse)
def rollout_page(request: Request, session: SessionDep, rollout_id: uuid.UUID) -> HTMLResponse:
    principal = _principal(request, session)
    try:
        row = rollouts.to_read(session, rollouts.get(session, rollout_id))
    except BlkpilotError as error:
        return _page(request, "error.html", principal, status=404, detail=error.detail)
    return _page(request, "rollout.html", principal, rollout=row)


@router.post("/devices/{device_id}/policy/{action}")
def policy_action(
    request: Request,
    session: SessionDep,
    device_id: uuid.UUID,
    action: str,
    csrf: Annotated[str, Form()],
    reason: Annotated[str, Form()] = "",
) -> Response:
    """Undo from the device page: revert (back to the configuration before the policy's
    current version) or clear (no policy: the device keeps what it runs); both audited."""
    principal = _act(request, session, csrf)
    if action not in ("revert", "clear"):
        raise ActionRefused(404, f"no action {action!r}")
    why = reason.strip() or f"{action} in the dashboard"
    try:
        if action == "revert":
            read = policies.revert_policy(session, principal, device_id, why)
            message = f"reverted: v{read.version} asks for {_key(read.config.model_dump())}"
        else:
            policies.clear_policy(session, principal, device_id, why)
            message = "policy cleared: the device keeps what it runs"
    except BlkpilotError as error:
        raise ActionRefused(error.status_code, error.detail) from error
    return RedirectResponse(f"/ui/devices/{device_id}?message={message}", status_code=303)


@router.post("/rollouts/{rollout_id}/abort")
def abort_rollout(
    request: Request,
    session: SessionDep,
    rollout_id: uuid.UUID,
    csrf: Annotated[str, Form()],
    reason: Annotated[str, Form()] = "",
) -> Response:
    principal = _act(request, session, csrf)
    try:
        rollouts.abort(session, principal, rollout_id, reason.strip() or "aborted in the dashboard")
    except BlkpilotError as error:
        raise ActionRefused(error.status_code, error.detail) from error
    return RedirectResponse(f"/ui/rollouts/{rollout_id}?message=rolling back", status_code=303)


@router.get("/models", response_class=HTMLResponse)
def models_page(request: Request, session: SessionDep) -> HTMLResponse:
    principal = _principal(request, session)
    versions = recommendations.model_versions(session, run_id=None, limit=200, offset=0)
    return _page(request, "models.html", principal, versions=versions)
