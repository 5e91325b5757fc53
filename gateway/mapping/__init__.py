"""What the protocols share of the mapping, written once: the skeleton every HTTP route runs
(protocol.py), strict request bodies, field declarations, conversations, tools, structured output
and log probabilities."""
