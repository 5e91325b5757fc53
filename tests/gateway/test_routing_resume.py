"""A stream moved off a lost replica (gateway/fleet/routing.py) goes on as an SSE reconnect does
(gateway/edge/resumable.py), by the same policies: a sampled request gets a seed first, and the
move goes on from the request's own tokens and those sent since, its text after the text sent."""
import pytest
from jina.types.request.data import SingleDocumentRequest

from gateway.fleet.routing import Migration, draw_seed
from gateway.mapping.policies import sampled
from schemas import ModelOutputDocument, PromptDocument


def request(**fields) -> SingleDocumentRequest:
    made = SingleDocumentRequest()
    made.document_cls = PromptDocument
    made.data.doc = PromptDocument(prompt="hi", **fields)
    return made


def document(req: SingleDocumentRequest) -> PromptDocument:
    return PromptDocument.from_protobuf(req.proto.document)


@pytest.mark.parametrize("fields", [{"do_sample": True}, {"do_sample": True, "temperature": 0},
                                    {"do_sample": True, "temperature": 0.5}, {"do_sample": False}, {},
                                    {"do_sample": True, "seed": 5}])
def test_a_sampled_request_without_a_seed_gets_one_on_the_wire(fields):
    req = request(**fields)
    draw_seed(req)
    seed = document(req).seed
    if "seed" in fields:
        assert seed == fields["seed"]
    elif sampled(fields.get("do_sample"), fields.get("temperature")):
        assert seed is not None
    else:
        assert seed is None


def test_a_move_goes_on_from_the_requests_tokens_and_those_sent_since():
    migration = Migration(request(resume_tokens=[1, 2]))
    for out in (ModelOutputDocument(token_ids=[3], text="a", generated_text="a"),
                ModelOutputDocument(token_ids=[4], text="b", generated_text="ab")):
        data = out.to_protobuf().data
        migration.patch(data)
        assert data["generated_text"].text == out.generated_text  # not moved: as the replica sent it
        migration.sent(data)
    assert migration.sent_any and migration.movable
    assert document(migration.resumed()).resume_tokens == [1, 2, 3, 4]
    data = ModelOutputDocument(token_ids=[5], text="c", generated_text="c").to_protobuf().data
    migration.patch(data)
    assert data["generated_text"].text == "abc"  # the new replica's text after what was sent
