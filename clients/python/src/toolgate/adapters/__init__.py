"""Two-line guards for agent frameworks' tools: `toolgate.adapters.openai_agents`
(the OpenAI Agents SDK) and `toolgate.adapters.langchain` (langchain-core).
Each is imported on its own, so the framework is needed only when used."""
