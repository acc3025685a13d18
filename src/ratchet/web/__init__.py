"""The web apps (the runs API, the approval pages), apart from any runtime: the Lambda
functions serve them on AWS (`ratchet.handlers`), `ratchet serve` locally."""
