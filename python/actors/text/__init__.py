"""Token ids to text and back, shared by the server's tokenizer actor and the offline LLM
(no Trio here)."""
