import json

from blackboard.schemas import json_schemas

print(json.dumps(json_schemas(), indent=2, sort_keys=True))
