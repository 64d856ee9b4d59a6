"""Tool calling: the JSON schemas that constrain `required` and named tool choices (`constraint`), the parsers
that find tool calls in a model's free output (`parsers`, one per chat-template family), and the choice of
parser for a chat template (`parsers.parser_for_template`). Pure functions over texts and request models."""
