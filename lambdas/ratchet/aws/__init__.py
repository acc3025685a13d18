"""The AWS runtime: the engine on DynamoDB, driven by a Step Functions state machine."""
