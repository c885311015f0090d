"""The fanout publisher: the aiohttp edge that takes jobs and serves streams over SSE with resume."""
