import type { PromptResponse } from "@agentclientprotocol/sdk";
import type { ScenarioCall } from "./prompt-line.js";
import { agentState, replay } from "./scenarios/agent-state.js";
import { echoEnv, hello, ignoredUpdates, stop, tools } from "./scenarios/basic.js";
import { fsRequest, permission, permissionFlood, terminalRequest } from "./scenarios/client-calls.js";
import {
  closeStdout,
  crashAfterResponse,
  crashBeforeResponse,
  grandchild,
  hang,
  malformed,
  oversized,
  promptError,
  strayResponse,
} from "./scenarios/faults.js";
import { gitPlantAll } from "./scenarios/git-plants.js";
import { recall } from "./scenarios/recall.js";
import { gitPlant, gitWork, homeProbe, plant, seek } from "./scenarios/sandbox.js";
import { echoArgv, escapes, listFds, readCredentials } from "./scenarios/security.js";
import { burst, slow } from "./scenarios/streams.js";
import { escapeGroup, leftovers, note, readProcess } from "./scenarios/tenancy.js";
import { editFile, editFiles } from "./scenarios/workspace.js";
import { END_TURN, type Scenario, say, type Turn } from "./turn.js";

/** Every scenario, by the NAME used in `scenario: NAME`. */
export const SCENARIOS = {
  hello,
  tools,
  burst,
  slow,
  permission,
  permission_flood: permissionFlood,
  stop,
  prompt_error: promptError,
  crash_before_response: crashBeforeResponse,
  crash_after_response: crashAfterResponse,
  malformed,
  oversized,
  stray_response: strayResponse,
  hang,
  close_stdout: closeStdout,
  fs_request: fsRequest,
  terminal_request: terminalRequest,
  grandchild,
  echo_env: echoEnv,
  ignored_updates: ignoredUpdates,
  escapes,
  read_credentials: readCredentials,
  list_fds: listFds,
  echo_argv: echoArgv,
  escape: escapeGroup,
  leftovers,
  read_process: readProcess,
  note,
  plant,
  seek,
  home_probe: homeProbe,
  git_work: gitWork,
  git_plant: gitPlant,
  git_plant_all: gitPlantAll,
  edit_file: editFile,
  edit_files: editFiles,
  agent_state: agentState,
  replay,
  recall,
} as const satisfies Record<string, Scenario>;

export type ScenarioName = keyof typeof SCENARIOS;
export const SCENARIO_NAMES = Object.keys(SCENARIOS) as ScenarioName[];

function isScenarioName(name: string): name is ScenarioName {
  return Object.hasOwn(SCENARIOS, name);
}

/** Plays the scenario a prompt asked for; unknown names end the turn listing the valid ones. */
export async function play(turn: Turn, call: ScenarioCall): Promise<PromptResponse> {
  if (!isScenarioName(call.name)) {
    await say(turn, `Unknown scenario "${call.name}". Valid scenarios: ${SCENARIO_NAMES.join(", ")}.`);
    return END_TURN;
  }
  if (call.stray.length > 0) {
    await say(turn, `Invalid parameters for scenario ${call.name}: expected key=value, got ${call.stray.join(" ")}`);
    return END_TURN;
  }
  return SCENARIOS[call.name].run(turn, call.params);
}
