"""instructor in TOOLS mode against the service: prints the object it gets. Run by
tests/real_model/test_tool_clients.py with .venv-clients: instructor needs urllib3 2, Jina pins < 2."""
import sys

import instructor
import openai
from pydantic import BaseModel


class Person(BaseModel):
    name: str
    age: int


client = instructor.from_openai(openai.OpenAI(base_url=sys.argv[1], api_key="unused"), mode=instructor.Mode.TOOLS)
person = client.chat.completions.create(
    model="SmolLM2-135M-Instruct", response_model=Person, max_retries=0, temperature=0, max_tokens=80,
    messages=[{"role": "user", "content": "Invent a person with a name and an age."}])
print(person.model_dump_json())
