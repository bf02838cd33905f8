//! The one shape of every error Drip's HTTP routes answer, the JSON of Google's APIs
//! (`google.rpc.Status`): `{"error": {"code": 404, "status": "NOT_FOUND", "message": "no such rule"}}`.
//! The services write it (drip-service's `api_error`), the CLI reads its message.

/// The error body for HTTP status `code` and the message a person reads.
pub fn body(code: u16, message: &str) -> serde_json::Value {
    serde_json::json!({ "error": { "code": code, "status": status_name(code), "message": message } })
}

/// The canonical name Google's APIs give a status (`INVALID_ARGUMENT` for 400 and 422...).
pub fn status_name(code: u16) -> &'static str {
    match code {
        400 | 413 | 415 | 422 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        405 => "METHOD_NOT_ALLOWED",
        409 => "ALREADY_EXISTS",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "UNKNOWN",
    }
}

/// The message of an error answer in this shape, or the text itself when it is not one.
pub fn message_of(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| text.trim().to_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_error_body_reads_back_as_its_message() {
        let body = super::body(404, "no such rule");
        assert_eq!(
            body,
            serde_json::json!({ "error": { "code": 404, "status": "NOT_FOUND", "message": "no such rule" } })
        );
        assert_eq!(super::message_of(&body.to_string()), "no such rule");
        assert_eq!(super::message_of("plain text\n"), "plain text");
    }
}
