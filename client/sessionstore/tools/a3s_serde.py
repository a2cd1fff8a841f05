# What a3s-code-core's serde derives make of the JSON it stores: the fields a
# SessionData cannot be read without, what a missing field reads as, what an
# artifact manifest loads as, and the bytes serde_json writes for a value (the
# input of every upstream digest). Read at A3S-Lab/Code: core/src/store/
# session_data.rs (e13ee21d), core/src/tools/{artifacts.rs,result_transform.rs,
# mod.rs,presentation.rs (e869ff54)}, core/src/llm/types.rs,
# core/src/config/mod.rs, core/src/prompts.rs.
#
# Serde's rules, as they apply here: a field without #[serde(default)] must be
# present, except an Option, which reads as None; #[serde(default)] reads a
# missing field as the type's Default; unknown fields are dropped (none of
# these structs deny them); skip_serializing_if leaves a None out when the
# value is written again, and a None without it is written as null.
from __future__ import annotations

import json
import math
from typing import Any

# SessionData and SessionConfig fields that serde cannot do without
SESSION_REQUIRED = (
    "id", "config", "state", "messages", "context_usage", "total_usage", "tool_names",
    "thinking_enabled", "created_at", "updated_at",
)  # fmt: skip
CONFIG_REQUIRED = ("name", "workspace", "max_context_length", "auto_compact")
# ToolResultTransformPolicyV1::conservative(), its Default (MAX_OUTPUT_SIZE = 100 KiB)
MAX_TOOL_OUTPUT_BYTES = 100 * 1024
CONSERVATIVE_TRANSFORM_POLICY: dict[str, Any] = {
    "schema": "a3s.code.tool-result-transform-policy.v1",
    "max_output_bytes": MAX_TOOL_OUTPUT_BYTES,
    "head_bytes": MAX_TOOL_OUTPUT_BYTES,
    "tail_bytes": 0,
    "fold_repeated_lines": False,
    "repeated_line_threshold": 3,
    "structured_sample_items": 0,
}
# ToolPresentationProfileV1::default(), which is adaptive()
ADAPTIVE_PRESENTATION_PROFILE: dict[str, Any] = {
    "schema": "a3s.code.tool-presentation-profile.v1",
    "mode": "adaptive",
}
# a missing field reads as: #[serde(default)] fields at their Default, and the
# Options that are written as null when None (no skip_serializing_if)
SESSION_DEFAULTS: dict[str, Any] = {
    "total_cost": 0.0, "cost_records": [], "tasks": [], "thinking_budget": None,
}  # fmt: skip
CONFIG_DEFAULTS: dict[str, Any] = {
    "system_prompt": None,
    "auto_compact_threshold": 0.8,  # DEFAULT_AUTO_COMPACT_THRESHOLD
    "storage_type": "file",  # StorageBackend::File, lowercase
    "planning_mode": "Auto",  # PlanningMode::Auto
    "goal_tracking": False,
    "tool_result_transform_policy": CONSERVATIVE_TRANSFORM_POLICY,
    "tool_presentation_profile": ADAPTIVE_PRESENTATION_PROFILE,
}
# Options with skip_serializing_if = "Option::is_none": a null is read as None and
# never written back; the confirmation and permission policies are two of them
SESSION_SKIPPED_WHEN_NONE = (
    "model_name", "llm_config", "parent_id", "tenant_id", "principal",
    "agent_template_id", "correlation_id", "cognitive_package_binding",
)  # fmt: skip
CONFIG_SKIPPED_WHEN_NONE = (
    "queue_config", "confirmation_policy", "permission_policy", "max_parallel_tasks",
    "auto_delegation", "parent_id", "security_config",
)  # fmt: skip
# ToolArtifact's fields, all required; ArtifactStoreLimits::default()
ARTIFACT_FIELDS = (
    "artifact_id", "artifact_uri", "tool_name", "content", "original_bytes", "shown_bytes",
)  # fmt: skip
MAX_ARTIFACTS = 256
MAX_ARTIFACT_BYTES = 16 * 1024 * 1024


class Unreadable(ValueError):
    """What serde would refuse, in its own words where it has them."""


def _missing(value: dict[str, Any], required: tuple[str, ...], where: str) -> None:
    for name in required:
        if name not in value:
            raise Unreadable(f"missing field `{name}` in {where}")


def check_session(session: Any) -> None:
    """The fields upstream cannot load a SessionData without."""
    if not isinstance(session, dict):
        raise Unreadable("the session is not a JSON object")
    _missing(session, SESSION_REQUIRED, "SessionData")
    if not isinstance(session["config"], dict):
        raise Unreadable("the session's config is not a JSON object")
    _missing(session["config"], CONFIG_REQUIRED, "SessionConfig")


def _fill(value: dict[str, Any], defaults: dict[str, Any], skipped: tuple[str, ...]) -> None:
    for name, default in defaults.items():
        value.setdefault(name, json.loads(json.dumps(default)))
    for name in skipped:
        if name in value and value[name] is None:
            del value[name]


def session_as_read(session: dict[str, Any]) -> dict[str, Any]:
    """The SessionData that upstream's load_snapshot returns for an old one as
    written, in JSON: every missing field at what serde reads it as."""
    check_session(session)
    read = dict(session)
    if "tasks" not in read and "todos" in read:  # #[serde(alias = "todos")]
        read["tasks"] = read.pop("todos")
    _fill(read, SESSION_DEFAULTS, SESSION_SKIPPED_WHEN_NONE)
    config = dict(read["config"])
    _fill(config, CONFIG_DEFAULTS, CONFIG_SKIPPED_WHEN_NONE)
    if config.get("enforce_active_skill_tool_restrictions") is False:  # skip_serializing_if
        del config["enforce_active_skill_tool_restrictions"]
    read["config"] = config
    return read


def artifact_store(manifest: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """ArtifactStore::load_from_manifest_bytes, then SessionSnapshotV1::new: the
    artifacts in insertion order (an exact repeat kept once, a URI bound to other
    content refused, the oldest evicted past the default limits, before the
    retention roots are set) and the retained URIs, empty ones dropped, sorted."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("artifacts"), list):
        raise Unreadable('an artifact manifest holds {"artifacts": [...]}')
    retained = manifest.get("retained_uris", [])
    if not isinstance(retained, list) or not all(isinstance(u, str) for u in retained):
        raise Unreadable("retained_uris must be a JSON array of text")
    kept: dict[str, dict[str, Any]] = {}
    total_bytes = 0
    for position, item in enumerate(manifest["artifacts"]):
        if not isinstance(item, dict):
            raise Unreadable(f"artifacts[{position}] is not a JSON object")
        _missing(item, ARTIFACT_FIELDS, f"ToolArtifact artifacts[{position}]")
        artifact = {name: item[name] for name in ARTIFACT_FIELDS}
        uri, content = artifact["artifact_uri"], artifact["content"]
        if not isinstance(uri, str) or not isinstance(content, str):
            raise Unreadable(f"artifacts[{position}]: artifact_uri and content must be text")
        if uri in kept:
            if kept[uri] != artifact:
                raise Unreadable(
                    f"invalid artifact manifest: artifact URI {uri!r} is already bound to "
                    "different content"
                )
            continue
        kept[uri] = artifact
        total_bytes += len(content.encode())
        while kept and (len(kept) > MAX_ARTIFACTS or total_bytes > MAX_ARTIFACT_BYTES):
            oldest = next(iter(kept))
            total_bytes -= len(kept.pop(oldest)["content"].encode())
    return list(kept.values()), sorted({uri for uri in retained if uri})


def _float_text(number: float) -> str:
    """ryu's shortest form, laid out as serde_json writes an f64: 1e16 and 1.5e-5
    where Python writes 1e+16 and 1.5e-05. Python's repr has the same digits."""
    if not math.isfinite(number):
        return "null"
    if number == 0:
        return "-0.0" if math.copysign(1.0, number) < 0 else "0.0"
    sign = "-" if number < 0 else ""
    mantissa, _, exponent = repr(abs(number)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    figures = whole + fraction
    significant = figures.lstrip("0")
    point = len(whole) + int(exponent or 0) - (len(figures) - len(significant))
    digits = significant.rstrip("0")
    length = len(digits)
    if length <= point <= 16:
        return f"{sign}{digits}{'0' * (point - length)}.0"
    if 0 < point <= 16:
        return f"{sign}{digits[:point]}.{digits[point:]}"
    if -5 < point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    tail = f".{digits[1:]}" if length > 1 else ""
    return f"{sign}{digits[0]}{tail}e{point - 1}"


def compact_json(value: Any) -> str:
    """serde_json::to_vec of a parsed value: no spaces, raw UTF-8, keys in order."""
    if isinstance(value, dict):
        return "{" + ",".join(
            json.dumps(str(k), ensure_ascii=False) + ":" + compact_json(v)
            for k, v in value.items()
        ) + "}"  # fmt: skip
    if isinstance(value, list):
        return "[" + ",".join(compact_json(item) for item in value) + "]"
    if isinstance(value, float):
        return _float_text(value)
    return json.dumps(value, ensure_ascii=False)
