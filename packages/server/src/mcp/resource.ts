/**
 * Discovery without a fourth tool: the read-only resource
 * `webcodex://projects` lists the projects the caller may use, whether each
 * project's Runner is online, and the sanitized providers it advertises
 * (id, name, allowed config option ids). No paths, executables or env.
 */
import type { ReadResourceResult, Resource } from "@modelcontextprotocol/server";
import { canSeeProject } from "../principals/authority.js";
import type { Principal } from "../principals/principal.js";
import type { ProjectView, RunsApi } from "../runs/api.js";

export const PROJECTS_RESOURCE_URI = "webcodex://projects";

export const PROJECTS_RESOURCE: Resource = {
  uri: PROJECTS_RESOURCE_URI,
  name: "projects",
  title: "Projects you may run coding agents on",
  description:
    "JSON: {projects: [{project_id, runner_online, allow_patch, agents_share_runner_user, providers: [{provider_id, name, allowed_config_options}]}]}. " +
    "Use project_id and provider_id with start_coding_agent. agents_share_runner_user: true when that Runner's " +
    "agents run as its own OS user (any run there can read what the others do), null when offline or not stated.",
  mimeType: "application/json",
};

export interface ProjectsDocument {
  projects: ProjectView[];
}

/** The caller's projects, sanitized field by field (nothing the run core adds leaks through). */
export async function projectsDocument(runs: RunsApi, principal: Principal): Promise<ProjectsDocument> {
  const projects = (await runs.listProjects(principal))
    .filter((p) => canSeeProject(principal, p.project_id))
    .map((p) => ({
      project_id: p.project_id,
      runner_online: p.runner_online,
      allow_patch: p.allow_patch,
      agents_share_runner_user: p.agents_share_runner_user,
      providers: p.providers.map((v) => ({
        provider_id: v.provider_id,
        name: v.name,
        allowed_config_options: [...v.allowed_config_options],
      })),
    }))
    .sort((a, b) => a.project_id.localeCompare(b.project_id));
  return { projects };
}

export async function readProjectsResource(runs: RunsApi, principal: Principal): Promise<ReadResourceResult> {
  return {
    contents: [
      {
        uri: PROJECTS_RESOURCE_URI,
        mimeType: "application/json",
        text: JSON.stringify(await projectsDocument(runs, principal)),
      },
    ],
  };
}
