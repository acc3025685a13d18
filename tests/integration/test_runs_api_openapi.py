"""The committed OpenAPI document is the one the routes generate, and says what they do."""

from __future__ import annotations

import json
from pathlib import Path

from ratchet.runs import MAX_BATCHES, MAX_STEPS, MAX_TOOL_LATENCY_MS, RunRequest
from ratchet.web.runs import openapi_document, openapi_text

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
REGENERATE = ".venv/bin/python -m ratchet.web.runs --openapi > docs/openapi.json"


def test_the_committed_document_is_what_the_routes_generate():
    assert DOCUMENT.read_text(encoding="utf-8") == openapi_text(), (
        f"docs/openapi.json is out of date with the routes; regenerate it: {REGENERATE}"
    )


def test_every_route_is_documented_with_its_refusals():
    paths = openapi_document()["paths"]

    assert {(p, m) for p, ops in paths.items() for m in ops} == {
        ("/runs", "post"),
        ("/runs", "get"),
        ("/runs/{run_id}", "get"),
        ("/runs/{run_id}/history", "get"),
        ("/runs/{run_id}/checkpoints/{step}", "get"),
        ("/runs/{run_id}/approve", "post"),
        ("/runs/{run_id}/reject", "post"),
        ("/runs/{run_id}/retry", "post"),
        ("/runs/{run_id}/cancel", "post"),
        ("/runs/{run_id}/fork", "post"),
        ("/runs/{run_id}/events/{name}", "post"),
        ("/runs/{run_id}/wake", "post"),
        ("/runs/{run_id}/hooks/{name}", "post"),
        ("/runs/{run_id}/steps/{step}/prompt", "get"),
        ("/schedules", "get"),
        ("/schedules", "post"),
        ("/schedules/{name}/pause", "post"),
        ("/schedules/{name}/resume", "post"),
        ("/schedules/{name}", "delete"),
    }
    for path, operations in paths.items():
        for operation in operations.values():
            responses = operation["responses"]
            # Validation errors are answered as 400; a 422 is only a payload an event wait's
            # schema refuses.
            assert ("422" in responses) == (path == "/runs/{run_id}/events/{name}"), path
            refused = {"$ref": "#/components/schemas/RequestRefused"}
            for code, response in responses.items():
                if int(code) >= 400:
                    assert response["content"]["application/json"]["schema"] == refused


def test_the_start_body_carries_every_field_and_bound():
    schema = openapi_document()["components"]["schemas"]["RunRequest"]

    assert set(schema["properties"]) == set(RunRequest.model_fields)
    assert schema["additionalProperties"] is False
    bounds = {
        name: next(s for s in schema["properties"][name]["anyOf"] if s["type"] == "integer")
        for name in ("max_steps", "batches", "tool_latency_ms")
    }
    assert {name: (b["minimum"], b["maximum"]) for name, b in bounds.items()} == {
        "max_steps": (1, MAX_STEPS),
        "batches": (1, MAX_BATCHES),
        "tool_latency_ms": (0, MAX_TOOL_LATENCY_MS),
    }


def test_the_document_names_the_iam_signature_it_needs():
    document = json.loads(openapi_text())

    assert document["security"] == [{"sigv4": []}]
    assert document["components"]["securitySchemes"]["sigv4"]["x-amazon-apigateway-authtype"] == (
        "awsSigv4"
    )


def test_an_event_is_answered_200_delivered_or_202_queued_with_what_the_desk_said():
    operation = openapi_document()["paths"]["/runs/{run_id}/events/{name}"]["post"]

    assert {"200", "202", "404", "409", "413", "422", "429"} <= set(operation["responses"])
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body["anyOf"][0] == {"$ref": "#/components/schemas/SendEvent"}
    schemas = openapi_document()["components"]["schemas"]
    assert set(schemas["SendEvent"]["properties"]) == {"data", "event_id"}
    assert set(schemas["EventSent"]["required"]) == {
        "run_id",
        "name",
        "event_id",
        "status",
        "step",
        "duplicate",
        "refused",
    }


def test_opening_a_hook_takes_no_body_and_answers_its_url_and_secret():
    operation = openapi_document()["paths"]["/runs/{run_id}/hooks/{name}"]["post"]

    assert {"200", "400", "403", "404", "409", "415"} <= set(operation["responses"])
    assert "requestBody" not in operation
    schemas = openapi_document()["components"]["schemas"]
    assert set(schemas["HookOpened"]["required"]) == {"run_id", "name", "hook_id", "url", "secret"}
